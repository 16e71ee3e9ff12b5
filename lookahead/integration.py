"""Turning lookahead on for one model or one text-generation pipeline: :func:`enable` / :func:`disable`.

    lookahead.enable(model)
    model.generate(**inputs, assistant=LookaheadDecoder(window=0))  # decodes with that decoder
    model.generate(**inputs, lookahead=True)                         # with the default decoder
    lookahead.enable(pipe, default=LookaheadDecoder())  # a text-generation pipeline's calls use it
    pipe("def fib(n):", lookahead=False)                # plain generate for this call

``assistant=decoder`` and ``custom_generate=decoder`` (the latter works without ``enable`` too) decode with that
decoder; ``lookahead=True`` with the default one (``enable``'s ``default=``, else a ``LookaheadDecoder()``);
``lookahead=False`` is plain ``generate``; no flag: the default decoder if ``enable`` got one and it supports the
call, else plain ``generate``. Every other argument goes to ``generate`` unchanged. The implicit default falls back,
explicit flags never do: a call without a flag that the decoder refuses, or that asks for another method
(``assistant_model=``, ``prompt_lookup_num_tokens=``, another ``custom_generate=``), runs plain ``generate`` or that
method, with a warning. Concurrent calls of the model's own decoder get siblings of it (``LookaheadDecoder.sibling``).
``enable`` refuses a ``generate`` already replaced on the instance (a Hub ``custom_generate`` loaded with
``trust_remote_code=True``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import warnings

import torch

from . import compat
from .checks import check_supported, is_refusal
from .decoder import LookaheadDecoder

__all__ = ["LookaheadGenerate", "enable", "disable", "is_enabled"]

_OTHER_METHODS = ("assistant_model", "prompt_lookup_num_tokens", "custom_generate")  # generate()'s other methods


class LookaheadGenerate:
    """The ``generate`` that :func:`enable` puts on ``model``. ``default``: the decoder of calls without a flag (None:
    they are plain); ``decoder``: that of ``lookahead=True``."""

    def __init__(self, model, default: LookaheadDecoder | None = None):
        self.model = model
        self.default = self._decoder = default
        self._lock = threading.Lock()
        self._siblings: dict[int, list[LookaheadDecoder]] = {}  # per own decoder, the ones concurrent calls made
        self._running: set[int] = set()

    def __getstate__(self):  # copy / pickle (a copied model's): no lock, no siblings of the running calls
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_siblings", "_running")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock, self._siblings, self._running = threading.Lock(), {}, set()

    @contextlib.contextmanager
    def _stream(self, decoder: LookaheadDecoder):
        """``decoder``, or while another thread's call runs it an idle sibling of it, made on first need and kept."""
        with self._lock:
            family = [decoder, *self._siblings.get(id(decoder), [])]
            free = next((d for d in family if id(d) not in self._running), None)
            if free is None:
                free = decoder.sibling()
                self._siblings.setdefault(id(decoder), []).append(free)
            self._running.add(id(free))
        try:
            yield free
        finally:
            with self._lock:
                self._running.discard(id(free))

    @property
    def decoder(self) -> LookaheadDecoder:
        if self._decoder is None:
            self._decoder = LookaheadDecoder()
        return self._decoder

    def __repr__(self) -> str:
        return f"<lookahead-enabled generate of {type(self.model).__name__}, default={self.default!r}>"

    def __call__(self, *args, assistant: LookaheadDecoder | None = None, lookahead: bool | None = None, **kwargs):
        decoder = self._choose(assistant, lookahead, args, kwargs)
        if decoder is not None and assistant is None:  # this model's own decoder: concurrent calls get siblings
            with self._stream(decoder) as free:
                return self._generate(free, assistant, lookahead, args, kwargs)
        return self._generate(decoder, assistant, lookahead, args, kwargs)

    def _generate(self, decoder, assistant, lookahead, args, kwargs):
        implicit = decoder is not None and assistant is None and lookahead is None  # the default, unasked for
        given = dict(kwargs)
        if decoder is None and isinstance(kwargs.get("custom_generate"), LookaheadDecoder):
            decoder = kwargs.pop("custom_generate")
        if decoder is not None:
            # generate() puts the prompt into the streamer, the decoder the rest; generate() would drop the tokenizer
            bound = {k: kwargs[k] for k in ("streamer", "tokenizer") if kwargs.get(k) is not None}
            kwargs.pop("tokenizer", None)
            config = kwargs.get("generation_config") or self.model.generation_config
            if getattr(config, "stop_strings", None) and kwargs.get("stop_strings") is None:
                kwargs["stop_strings"] = config.stop_strings  # generate() would refuse them without a tokenizer
                kwargs["generation_config"] = copy.deepcopy(config)
                kwargs["generation_config"].stop_strings = None
            kwargs["custom_generate"] = functools.partial(decoder, **bound) if bound else decoder
        try:
            return type(self.model).generate(self.model, *args, **kwargs)
        except ValueError as err:  # refused in the decoder's own set-up (what _why_not_default cannot see ahead)
            if not implicit or not is_refusal(err):
                raise
            warnings.warn(f"lookahead: this call runs plain generate(), not the default LookaheadDecoder: {err}",
                          UserWarning, stacklevel=2)
            if given.get("streamer") is not None:  # generate() has put the prompt into it once already
                given["streamer"] = _AfterPrompt(given["streamer"])
            return type(self.model).generate(self.model, *args, **given)

    def _choose(self, assistant, lookahead, args, kwargs) -> LookaheadDecoder | None:
        """The decoder this call uses, or None for plain generate()."""
        if assistant is not None and not isinstance(assistant, LookaheadDecoder):
            raise TypeError(f"assistant= takes a LookaheadDecoder, got {type(assistant).__name__}. For assisted "
                            "decoding with a draft model, pass assistant_model= instead.")
        if lookahead is not None and not isinstance(lookahead, bool):
            raise TypeError(f"lookahead= takes True or False, got {type(lookahead).__name__}; pass a configured "
                            "decoder as assistant=LookaheadDecoder(...)")
        if assistant is not None and lookahead is not None:
            raise ValueError("pass either assistant=LookaheadDecoder(...) or lookahead=True/False, not both")
        others = ", ".join(k + "=" for k in _OTHER_METHODS if kwargs.get(k) is not None)
        if assistant is not None or lookahead:
            if others:
                flag = "assistant=" if assistant is not None else "lookahead=True"
                raise ValueError(f"{flag} cannot be combined with {others}; pick one")
            return assistant if assistant is not None else self.decoder
        if lookahead is False or self.default is None or isinstance(kwargs.get("custom_generate"), LookaheadDecoder):
            return None  # (a call naming its own decoder runs it, in _generate: nothing falls back)
        if others:  # generate() runs the method the call asks for: say that the default is not used, not why
            warnings.warn(f"lookahead: this call decodes with the method it asks for ({others}), not the default "
                          "LookaheadDecoder", UserWarning, stacklevel=3)
            return None
        reason = self._why_not_default(args, kwargs)
        if reason is not None:
            warnings.warn(f"lookahead: this call runs plain generate(), not the default LookaheadDecoder: {reason}",
                          UserWarning, stacklevel=3)
            return None
        return self.default

    def _why_not_default(self, args, kwargs) -> str | None:
        """Why the default decoder would not take this call (it would raise), or None when it would."""
        gen_kwargs = {k: v for k, v in kwargs.items() if k not in ("generation_config", "streamer")}
        try:  # the config generate() will use: the call's kwargs over generation_config over the model's
            config = compat.generation_config_for_call(self.model, kwargs.get("generation_config"), gen_kwargs)
        except Exception:  # generate() itself will raise the same, with its own message
            return None
        inputs = args[0] if args else next(
            (kwargs[k] for k in ("inputs", "input_ids", "inputs_embeds") if kwargs.get(k) is not None), None)
        batch = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else 1
        try:
            check_supported(self.model, batch * max(config.num_return_sequences or 1, 1), config,
                            bool(kwargs.get("synced_gpus")), self.default)
        except ValueError as err:
            return str(err)
        return None


class _AfterPrompt:
    """``streamer`` for a plain ``generate`` after a refused one, which put the prompt into it already: the first
    ``put`` (the prompt again) is dropped."""

    def __init__(self, streamer):
        self.streamer, self.prompt_put = streamer, False

    def put(self, value) -> None:
        if self.prompt_put:
            self.streamer.put(value)
        self.prompt_put = True

    def end(self) -> None:
        self.streamer.end()


def _model_of(target):
    """The model to enable for ``target`` (a generating model or a text-generation pipeline)."""
    from transformers import GenerationMixin, Pipeline, TextGenerationPipeline

    pipe = isinstance(target, TextGenerationPipeline)
    model = target.model if pipe else target
    if not (isinstance(model, GenerationMixin) and isinstance(model, torch.nn.Module)):
        if isinstance(target, Pipeline):
            raise TypeError(f"lookahead.enable takes a generating model or a text-generation pipeline, got a "
                            f"{type(target).__name__} (task {getattr(target, 'task', '?')!r})")
        raise TypeError("lookahead.enable takes a generating model or a text-generation pipeline (a transformers "
                        "model with a language-model head, e.g. from AutoModelForCausalLM), got "
                        f"{type(target).__name__}")
    if getattr(model.config, "is_encoder_decoder", False):
        what = f"the model of this {type(target).__name__}" if pipe else "this object"
        raise TypeError(f"lookahead.enable: {what} is an encoder-decoder model ({type(model).__name__}); "
                        "LookaheadDecoder supports decoder-only models")
    return model


def enable(target, default: LookaheadDecoder | None = None):
    """Let ``target.generate`` (a decoder-only model's, or a text-generation pipeline's model's) take the flags the
    module docstring describes, on that one instance; returns ``target``. Calling it again replaces ``default``."""
    model = _model_of(target)
    if default is not None and not isinstance(default, LookaheadDecoder):
        raise TypeError(f"default= takes a LookaheadDecoder or None, got {type(default).__name__}")
    current = vars(model).get("generate")
    if isinstance(current, LookaheadGenerate):
        current.default = current._decoder = default
    elif current is not None:
        raise ValueError(f"lookahead.enable: this {type(model).__name__}'s generate was already replaced on the "
                         f"instance ({current!r}), e.g. by a Hub custom_generate loaded with trust_remote_code=True; "
                         "lookahead will not stack on it")
    else:
        model.generate = LookaheadGenerate(model, default)
    return target


def disable(target):
    """Undo :func:`enable`; returns ``target``."""
    model = _model_of(target)
    if isinstance(vars(model).get("generate"), LookaheadGenerate):
        del model.generate
    return target


def is_enabled(target) -> bool:
    """Whether :func:`enable` is in effect for ``target`` (a model or a text-generation pipeline)."""
    return isinstance(vars(_model_of(target)).get("generate"), LookaheadGenerate)
