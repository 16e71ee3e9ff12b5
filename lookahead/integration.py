"""Turning lookahead on for one model or one text-generation pipeline: :func:`enable` / :func:`disable`.

    import lookahead
    from lookahead import LookaheadDecoder

    lookahead.enable(model)
    model.generate(**inputs, assistant=LookaheadDecoder(window=0))  # decodes with that decoder
    model.generate(**inputs, lookahead=True)                            # with the default decoder

    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    lookahead.enable(pipe, default=LookaheadDecoder())   # the one added line: existing calls use it
    pipe("def fib(n):", max_new_tokens=64, do_sample=False)
    pipe("def fib(n):", lookahead=False)                 # plain generate for this call

The spellings of a call to an enabled model's ``generate``:

==============================  =====================================================================
``assistant=decoder``           that :class:`~lookahead.LookaheadDecoder`
``lookahead=True``              the default decoder (``default=`` of ``enable``, else a ``LookaheadDecoder()``)
``custom_generate=decoder``     that decoder (works without ``enable`` too)
``lookahead=False``             plain ``generate``
no flag                         the default decoder if ``enable`` got ``default=`` and the decoder
                                supports the call, else plain ``generate`` (see below)
==============================  =====================================================================

Every other argument goes to ``generate`` unchanged; ``assistant_model=`` keeps its Hugging Face
meaning (assisted decoding with a draft model) and cannot be combined with an explicit flag.

How it works (the decisions):

- **One instance attribute, nothing on the class.** ``enable`` sets ``model.generate`` on that one
  object to a :class:`LookaheadGenerate` wrapper (the model's class and every other instance are left
  alone); ``disable`` deletes it (``del model.generate``) and the class's method shows through again.
  Both are idempotent. The wrapper translates the flags into ``custom_generate=decoder``, the public
  plugin point of ``generate``, and calls the class's ``generate`` with everything else untouched.
  A model whose ``generate`` is already replaced on the instance (e.g. a Hub ``custom_generate``
  loaded with ``trust_remote_code=True``) is refused rather than stacked on.
- **Pipelines.** A text-generation pipeline hands the keyword arguments it does not know itself to
  ``self.model.generate`` (``TextGenerationPipeline._sanitize_parameters`` keeps them as generate
  kwargs). So ``enable(pipe)`` enables ``pipe.model`` and ``pipe(text, lookahead=True)`` /
  ``pipe(text, assistant=...)`` / ``pipe(text, streamer=...)`` reach the wrapper; no pipeline method
  is overridden. Note that the model object is what is enabled: direct ``pipe.model.generate`` calls and
  other pipelines sharing that model see the same flags and default.
- **Stop strings.** ``generate`` drops ``tokenizer=`` for a callable ``custom_generate`` and then
  refuses ``stop_strings``; the wrapper passes the tokenizer to the decoder (and moves stop strings
  set in a generation config into the call), which checks them token by token.
- **Streamers.** ``generate`` puts the prompt into ``streamer=`` but does not pass the streamer to a
  callable ``custom_generate``. The wrapper passes both ``streamer=streamer`` (so ``generate`` puts the
  prompt once, exactly as plain ``generate`` does) and ``custom_generate=partial(decoder,
  streamer=streamer)`` (so the decoder puts each emitted block in order and calls ``end()``). The plain
  ``custom_generate=decoder, streamer=s`` spelling, without ``enable``, is routed by the decoder itself
  (see ``compat.streamer_of_calling_generate``).
- **The implicit default falls back, explicit flags never do.** With ``default=``, a call without a
  flag that the decoder would refuse (beam search, scores of a batch, anything else its own check
  rejects) runs plain ``generate``, with a warning naming the reason, so that adding the default never
  breaks an existing call. One that asks for another method (``assistant_model=``,
  ``prompt_lookup_num_tokens=``, a ``custom_generate=`` other than a decoder) runs that method, with a
  warning that the default is not used; one that passes ``custom_generate=decoder`` runs that decoder,
  without one. What only the decoder's set-up can tell (a batch of an ALiBi model, a padded row on a
  static cache past a sliding window, images on a static cache with sliding layers) is refused there,
  before any decoding step (``checks.is_refusal``), and the call then runs plain ``generate`` the same
  way (a streamer gets the prompt once). An explicit ``assistant=`` / ``lookahead=True`` raises the
  decoder's error instead.
- **Shared state.** A decoder holds its trie and its last call's ``stats``: use one decoder per
  concurrent stream. The default decoder of an enabled model is ``model.generate.decoder``.
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

# generate() arguments that select another decoding method than ours
_OTHER_METHODS = ("assistant_model", "prompt_lookup_num_tokens", "custom_generate")


class LookaheadGenerate:
    """The ``generate`` that :func:`enable` puts on one model instance (see the module docstring).

    - ``model``: the model it belongs to.
    - ``default``: the decoder used by calls without a flag, or None (calls without a flag are plain).
    - ``decoder``: the decoder used by ``lookahead=True`` (``default``, else one ``LookaheadDecoder()``).
    """

    def __init__(self, model, default: LookaheadDecoder | None = None):
        self.model = model
        self.default = default
        self._decoder = default
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
        """The decoder a call runs: ``decoder``, or (while another thread's call runs it) an idle sibling of it
        (``LookaheadDecoder.sibling``: the same settings, store, corpus and heads), made on first need and kept."""
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

    def __call__(self, *args, assistant: LookaheadDecoder | None = None, lookahead: bool | None = None,
                 **kwargs):
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
            bound = {}
            if kwargs.get("streamer") is not None:  # generate() puts the prompt; the decoder puts the rest
                bound["streamer"] = kwargs["streamer"]
            if kwargs.get("tokenizer") is not None:  # generate() would drop it; the decoder needs it for stop strings
                bound["tokenizer"] = kwargs.pop("tokenizer")
            config_stops = getattr(kwargs.get("generation_config") or self.model.generation_config, "stop_strings", None)
            if config_stops and kwargs.get("stop_strings") is None:  # generate() would refuse them without tokenizer
                kwargs["stop_strings"] = config_stops
                kwargs["generation_config"] = copy.deepcopy(kwargs.get("generation_config")
                                                            or self.model.generation_config)
                kwargs["generation_config"].stop_strings = None
            kwargs["custom_generate"] = functools.partial(decoder, **bound) if bound else decoder
        if not implicit:
            return type(self.model).generate(self.model, *args, **kwargs)
        try:
            return type(self.model).generate(self.model, *args, **kwargs)
        except ValueError as err:  # refused in the decoder's own set-up (what _why_not_default cannot see ahead)
            if not is_refusal(err):
                raise
            warnings.warn(f"lookahead: this call runs plain generate(), not the default LookaheadDecoder: {err}",
                          UserWarning, stacklevel=2)
            if given.get("streamer") is not None:  # generate() has put the prompt into it once already
                given["streamer"] = _AfterPrompt(given["streamer"])
            return type(self.model).generate(self.model, *args, **given)

    def _choose(self, assistant, lookahead, args, kwargs) -> LookaheadDecoder | None:
        """The decoder this call uses, or None for plain generate()."""
        if assistant is not None and not isinstance(assistant, LookaheadDecoder):
            raise TypeError(
                f"assistant= takes a LookaheadDecoder, got {type(assistant).__name__}. "
                "For assisted decoding with a draft model, pass assistant_model= instead."
            )
        if lookahead is not None and not isinstance(lookahead, bool):
            raise TypeError(
                f"lookahead= takes True or False, got {type(lookahead).__name__}; "
                "pass a configured decoder as assistant=LookaheadDecoder(...)"
            )
        if assistant is not None and lookahead is not None:
            raise ValueError("pass either assistant=LookaheadDecoder(...) or lookahead=True/False, not both")
        if assistant is not None or lookahead:
            others = [k for k in _OTHER_METHODS if kwargs.get(k) is not None]
            if others:
                flag = "assistant=" if assistant is not None else "lookahead=True"
                raise ValueError(f"{flag} cannot be combined with {', '.join(k + '=' for k in others)}; pick one")
            return assistant if assistant is not None else self.decoder
        if lookahead is False or self.default is None:
            return None
        if isinstance(kwargs.get("custom_generate"), LookaheadDecoder):
            return None  # the call names its own decoder, which __call__ takes: nothing falls back
        others = [k for k in _OTHER_METHODS if kwargs.get(k) is not None]
        if others:  # generate() runs the method the call asks for: say that the default is not used, not why
            warnings.warn(f"lookahead: this call decodes with the method it asks for ({', '.join(k + '=' for k in others)}),"
                          " not the default LookaheadDecoder", UserWarning, stacklevel=3)
            return None
        reason = self._why_not_default(args, kwargs)
        if reason is not None:
            warnings.warn(f"lookahead: this call runs plain generate(), not the default LookaheadDecoder: {reason}",
                          UserWarning, stacklevel=3)
            return None
        return self.default

    def _why_not_default(self, args, kwargs) -> str | None:
        """Why the default decoder would not take this call (it would raise), or None when it would."""
        model = self.model
        gen_kwargs = {k: v for k, v in kwargs.items() if k not in ("generation_config", "streamer")}
        try:
            # the config generate() will use: the call's kwargs over generation_config over the model's
            config = compat.generation_config_for_call(model, kwargs.get("generation_config"), gen_kwargs)
        except Exception:  # generate() itself will raise the same, with its own message
            return None
        inputs = args[0] if args else next(
            (kwargs[k] for k in ("inputs", "input_ids", "inputs_embeds") if kwargs.get(k) is not None), None
        )
        batch = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else 1
        batch *= max(config.num_return_sequences or 1, 1)
        try:
            check_supported(model, batch, config, bool(kwargs.get("synced_gpus")), self.default)
        except ValueError as err:
            return str(err)
        return None


class _AfterPrompt:
    """A streamer for a plain ``generate`` that follows a refused one: the refused call's ``generate`` put the prompt
    into ``streamer`` already, so the first ``put`` (the prompt again) is dropped; every later one, and ``end``,
    reach ``streamer``."""

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
    from transformers import GenerationMixin, TextGenerationPipeline

    if isinstance(target, TextGenerationPipeline):
        model, what = target.model, f"the model of this {type(target).__name__}"
    else:
        model, what = target, "this object"
    if isinstance(model, GenerationMixin) and isinstance(model, torch.nn.Module):
        if getattr(model.config, "is_encoder_decoder", False):
            raise TypeError(
                f"lookahead.enable: {what} is an encoder-decoder model ({type(model).__name__}); "
                "LookaheadDecoder supports decoder-only models"
            )
        return model
    from transformers import Pipeline

    if isinstance(target, Pipeline):
        raise TypeError(
            f"lookahead.enable takes a generating model or a text-generation pipeline, got a "
            f"{type(target).__name__} (task {getattr(target, 'task', '?')!r})"
        )
    raise TypeError(
        "lookahead.enable takes a generating model or a text-generation pipeline (a transformers model "
        f"with a language-model head, e.g. from AutoModelForCausalLM), got {type(target).__name__}"
    )


def enable(target, default: LookaheadDecoder | None = None):
    """Let ``target.generate`` (or the pipeline's) take ``assistant=`` and ``lookahead=`` flags.

    - ``target``: a decoder-only generating model, or a ``pipeline("text-generation", ...)`` (its model
      is enabled).
    - ``default``: a :class:`~lookahead.LookaheadDecoder` that calls *without* a flag use too (where it
      supports the call), and that ``lookahead=True`` uses. Without it, only flagged calls use lookahead
      and ``lookahead=True`` uses a ``LookaheadDecoder()``.

    Acts on that one instance only (an instance attribute ``generate``; the class is untouched).
    Calling it again replaces the default with the new call's. Returns ``target``. Undo with
    :func:`disable`.
    """
    model = _model_of(target)
    if default is not None and not isinstance(default, LookaheadDecoder):
        raise TypeError(f"default= takes a LookaheadDecoder or None, got {type(default).__name__}")
    current = vars(model).get("generate")
    if isinstance(current, LookaheadGenerate):
        current.default = current._decoder = default
        return target
    if current is not None:
        raise ValueError(
            f"lookahead.enable: this {type(model).__name__}'s generate was already replaced on the instance "
            f"({current!r}), e.g. by a Hub custom_generate loaded with trust_remote_code=True; "
            "lookahead will not stack on it"
        )
    model.generate = LookaheadGenerate(model, default)
    return target


def disable(target):
    """Undo :func:`enable`: ``target.generate`` is the class's plain ``generate`` again. Returns ``target``."""
    model = _model_of(target)
    if isinstance(vars(model).get("generate"), LookaheadGenerate):
        del model.generate
    return target


def is_enabled(target) -> bool:
    """Whether :func:`enable` is in effect for ``target`` (a model or a text-generation pipeline)."""
    return isinstance(vars(_model_of(target)).get("generate"), LookaheadGenerate)
