"""Fixed texts of the chat and summarise/rewrite workloads (shipped with the package, never downloaded)."""

from __future__ import annotations

CHAT_QUESTIONS = [
    "What are three good habits for keeping a small vegetable garden healthy?",
    "Explain the difference between a list and a tuple in Python, with a short example of each.",
    "How does a refrigerator keep food cold? Explain it simply.",
    "Give me a plan for learning to run 5 kilometres in eight weeks.",
    "Why is the sky blue during the day and red at sunset?",
    "Write a short, friendly email asking a colleague to review my pull request by Friday.",
    "What should I check before buying a second-hand bicycle?",
    "Explain what a hash table is and why lookups are fast on average.",
    "Suggest five names for a small bakery and say why each one works.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Describe how to make a cup of tea, step by step.",
    "What are the pros and cons of working from home?",
    "Explain recursion to a ten-year-old.",
    "How can I make my Python script run faster?",
    "What is photosynthesis and why does it matter for life on Earth?",
]

# Short passages for the grounded summarise/rewrite workload (written for this benchmark).
PASSAGES = [
    (
        "The town library opened a tool lending shelf last spring. Members can borrow drills, ladders, "
        "sewing machines and garden tools for up to two weeks, the same way they borrow books. The idea "
        "came from a survey in which many residents said they owned tools they used only once or twice a "
        "year. In the first six months, the shelf lent out more than nine hundred items, and the most "
        "popular were the pressure washer and the tile cutter. Volunteers check every tool when it comes "
        "back and write down any repairs it needs. The library now plans to add a shelf of kitchen "
        "equipment, such as bread makers and large cooking pots, after many requests from families."
    ),
    (
        "Honeybees communicate the location of food with a movement known as the waggle dance. A forager "
        "that has found a good patch of flowers returns to the hive and walks in a figure-eight pattern on "
        "the vertical comb. During the straight middle part of the figure, she shakes her body from side "
        "to side. The angle of this straight run relative to the vertical shows the direction of the food "
        "relative to the sun, and the length of the run shows the distance. Other bees follow the dancer, "
        "learn the direction and distance, and fly out to the same flowers. Because the sun moves during "
        "the day, dancers slowly change the angle of their runs to keep the message accurate."
    ),
    (
        "A version control system records every change made to a set of files, so that a team can see who "
        "changed what and when, and can return to any earlier state. Each saved change is called a commit "
        "and carries a message that explains its purpose. Branches let people work on new features without "
        "disturbing the main line of work; when a feature is ready, its branch is merged back. If two people "
        "change the same lines, the system reports a conflict, and a person decides which version to keep. "
        "Good commit messages are short, describe why a change was made, and make the history easy to read "
        "months later."
    ),
    (
        "The city council voted on Tuesday to extend the evening bus service on three routes. From the first "
        "of next month, buses on routes 4, 11 and 17 will run every twenty minutes until midnight, instead of "
        "every forty minutes until ten in the evening. The change follows complaints from hospital staff and "
        "restaurant workers whose shifts end late. The council estimates that the extra service will cost "
        "about two hundred thousand a year, paid partly by a small increase in parking fees in the city "
        "centre. A review after twelve months will decide whether the later timetable becomes permanent or "
        "is extended to more routes."
    ),
    (
        "Sourdough bread is leavened by a starter, a mixture of flour and water in which wild yeasts and "
        "lactic acid bacteria live together. The yeasts produce carbon dioxide, which makes the dough rise, "
        "while the bacteria produce acids that give the bread its sour taste and help it keep longer. A baker "
        "feeds the starter regularly with fresh flour and water to keep it active. Because the wild yeasts "
        "work more slowly than commercial yeast, sourdough needs a long rise, often overnight. The long "
        "fermentation also develops flavour and makes the crust darker and crisper when the loaf is baked in "
        "a very hot oven."
    ),
    (
        "Our support team answers questions by email and chat from eight in the morning to six in the "
        "evening on weekdays. Requests that arrive outside these hours are answered the next working day. "
        "Urgent problems, such as a service that is completely down, can be reported at any time through "
        "the status page, and an engineer on call will respond within one hour. When you contact us, please "
        "include your account number, a short description of the problem, the steps that lead to it and any "
        "error messages you saw. Screenshots help us understand the problem faster. We aim to solve most "
        "requests within two working days and will tell you if a fix will take longer."
    ),
    (
        "Glaciers form where more snow falls in winter than melts in summer. Over many years the snow is "
        "pressed into dense ice, which becomes so heavy that it begins to flow slowly downhill under its own "
        "weight. As a glacier moves, it scrapes the rock beneath it and carries stones and sand, carving "
        "U-shaped valleys and leaving ridges of debris called moraines. Most glaciers in the world are now "
        "shrinking, because warmer summers melt more ice than winter snow replaces. Their retreat raises sea "
        "levels and changes the flow of rivers that many towns depend on for water in dry months."
    ),
    (
        "To return an item, sign in to your account, open the order and choose Return Item. Select the reason "
        "for the return and whether you want a refund or an exchange. Print the prepaid label, pack the item "
        "in its original packaging if you still have it, and attach the label to the outside of the box. You "
        "can drop the parcel at any post office within thirty days of delivery. Refunds are paid to the "
        "original payment method within five working days after the item reaches our warehouse. Items that "
        "are damaged, used or missing parts may receive a partial refund."
    ),
]

REWRITE_INSTRUCTIONS = [
    "Summarise the following text in three bullet points.",
    "Rewrite the following text in simpler English for a young reader, keeping every fact.",
    "Rewrite the following text as a numbered list, one sentence per item, keeping the original wording.",
    "Summarise the following text in two sentences.",
    "Rewrite the following text in the first person plural (\"we\"), keeping everything else the same.",
    "List every number, time and quantity mentioned in the following text, each with what it refers to.",
]

EDIT_INSTRUCTIONS = [
    "Add type hints to the parameters and the return value of this function. Return the whole function.",
    "Rename the local variables to longer, descriptive names without changing behaviour. "
    "Return the whole function.",
    "Add a short comment above each block of this function explaining what it does. Return the whole function.",
    "Rewrite the docstring of this function in Google style (Args, Returns). Return the whole function.",
    "Add input validation that raises TypeError for arguments of the wrong type. Return the whole function.",
]
