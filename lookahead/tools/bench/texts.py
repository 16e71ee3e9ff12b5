"""The bench's fixed texts, written for it (no benchmark dataset's), shipped with the package."""

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
    ("The town library opened a tool lending shelf last spring. Members can borrow drills, ladders, "
     "sewing machines and garden tools for up to two weeks, the same way they borrow books. The idea "
     "came from a survey in which many residents said they owned tools they used only once or twice a "
     "year. In the first six months, the shelf lent out more than nine hundred items, and the most "
     "popular were the pressure washer and the tile cutter. Volunteers check every tool when it comes "
     "back and write down any repairs it needs. The library now plans to add a shelf of kitchen "
     "equipment, such as bread makers and large cooking pots, after many requests from families."),
    ("Honeybees communicate the location of food with a movement known as the waggle dance. A forager "
     "that has found a good patch of flowers returns to the hive and walks in a figure-eight pattern on "
     "the vertical comb. During the straight middle part of the figure, she shakes her body from side "
     "to side. The angle of this straight run relative to the vertical shows the direction of the food "
     "relative to the sun, and the length of the run shows the distance. Other bees follow the dancer, "
     "learn the direction and distance, and fly out to the same flowers. Because the sun moves during "
     "the day, dancers slowly change the angle of their runs to keep the message accurate."),
    ("A version control system records every change made to a set of files, so that a team can see who "
     "changed what and when, and can return to any earlier state. Each saved change is called a commit "
     "and carries a message that explains its purpose. Branches let people work on new features without "
     "disturbing the main line of work; when a feature is ready, its branch is merged back. If two people "
     "change the same lines, the system reports a conflict, and a person decides which version to keep. "
     "Good commit messages are short, describe why a change was made, and make the history easy to read "
     "months later."),
    ("The city council voted on Tuesday to extend the evening bus service on three routes. From the first "
     "of next month, buses on routes 4, 11 and 17 will run every twenty minutes until midnight, instead of "
     "every forty minutes until ten in the evening. The change follows complaints from hospital staff and "
     "restaurant workers whose shifts end late. The council estimates that the extra service will cost "
     "about two hundred thousand a year, paid partly by a small increase in parking fees in the city "
     "centre. A review after twelve months will decide whether the later timetable becomes permanent or "
     "is extended to more routes."),
    ("Sourdough bread is leavened by a starter, a mixture of flour and water in which wild yeasts and "
     "lactic acid bacteria live together. The yeasts produce carbon dioxide, which makes the dough rise, "
     "while the bacteria produce acids that give the bread its sour taste and help it keep longer. A baker "
     "feeds the starter regularly with fresh flour and water to keep it active. Because the wild yeasts "
     "work more slowly than commercial yeast, sourdough needs a long rise, often overnight. The long "
     "fermentation also develops flavour and makes the crust darker and crisper when the loaf is baked in "
     "a very hot oven."),
    ("Our support team answers questions by email and chat from eight in the morning to six in the "
     "evening on weekdays. Requests that arrive outside these hours are answered the next working day. "
     "Urgent problems, such as a service that is completely down, can be reported at any time through "
     "the status page, and an engineer on call will respond within one hour. When you contact us, please "
     "include your account number, a short description of the problem, the steps that lead to it and any "
     "error messages you saw. Screenshots help us understand the problem faster. We aim to solve most "
     "requests within two working days and will tell you if a fix will take longer."),
    ("Glaciers form where more snow falls in winter than melts in summer. Over many years the snow is "
     "pressed into dense ice, which becomes so heavy that it begins to flow slowly downhill under its own "
     "weight. As a glacier moves, it scrapes the rock beneath it and carries stones and sand, carving "
     "U-shaped valleys and leaving ridges of debris called moraines. Most glaciers in the world are now "
     "shrinking, because warmer summers melt more ice than winter snow replaces. Their retreat raises sea "
     "levels and changes the flow of rivers that many towns depend on for water in dry months."),
    ("To return an item, sign in to your account, open the order and choose Return Item. Select the reason "
     "for the return and whether you want a refund or an exchange. Print the prepaid label, pack the item "
     "in its original packaging if you still have it, and attach the label to the outside of the box. You "
     "can drop the parcel at any post office within thirty days of delivery. Refunds are paid to the "
     "original payment method within five working days after the item reaches our warehouse. Items that "
     "are damaged, used or missing parts may receive a partial refund."),
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

QUESTIONS = [
    "What is the capital city of Canada?",
    "How many bones are in the adult human body?",
    "Who wrote the novel Pride and Prejudice?",
    "What gas do plants take in from the air to make sugar?",
    "At what temperature does water boil at sea level, in degrees Celsius?",
    "Which planet in our solar system has the most moons?",
    "What is the largest ocean on Earth?",
    "In which year did the first person walk on the Moon?",
]

# (source language, target language, paragraph)
TRANSLATIONS = [
    ("English", "French", "The museum opens at nine in the morning and closes at six in the evening. Tickets "
     "are cheaper for students and free for children under twelve. Photography is allowed everywhere except "
     "in the special exhibition on the second floor."),
    ("English", "Spanish", "Our train was delayed by forty minutes because of snow on the tracks. When we "
     "finally arrived, the hotel had kept our room, and the owner made us hot soup even though the kitchen was "
     "already closed."),
    ("English", "German", "Please water the tomatoes every evening while I am away, but only give the cactus "
     "water once a week. The key to the garden shed is under the blue flower pot next to the door."),
    ("English", "Italian", "The meeting has been moved from Tuesday to Thursday afternoon. Bring the sales "
     "figures for the last quarter and a short list of questions for the new marketing team."),
    ("French", "English", "Le marché du samedi se tient sur la place de l'église. On y trouve des fruits, du "
     "fromage et du pain frais. Les commerçants arrivent très tôt, et les meilleurs produits partent avant dix "
     "heures."),
    ("Spanish", "English", "Mi abuela aprendió a nadar a los sesenta años. Cada mañana iba a la piscina del "
     "barrio con una amiga, y al final del verano ya podía cruzarla sin detenerse."),
    ("German", "English", "Die Bibliothek bleibt wegen Bauarbeiten bis Ende März geschlossen. Ausgeliehene "
     "Bücher können in dieser Zeit im Rathaus zurückgegeben werden, und die Leihfrist wird automatisch "
     "verlängert."),
    ("Portuguese", "English", "O festival de música começa na sexta-feira à noite. Haverá bandas locais, "
     "barracas de comida e uma área para crianças. A entrada é gratuita, mas é preciso reservar um lugar pela "
     "internet."),
]

NEWS = [
    "A small fishing town on the northern coast has opened its first public swimming pool in more than forty "
    "years. The pool, heated by waste warmth from the nearby fish processing plant, was paid for by a "
    "combination of a regional grant and donations from residents. The mayor said that local children had been "
    "travelling an hour by bus for swimming lessons. About three hundred people attended the opening on "
    "Saturday, and the pool will be free for school classes during its first year.",
    "Researchers at a university agricultural station reported this week that a mix of clover and grass "
    "produced as much hay as grass fed with chemical fertiliser. The three-year trial compared twelve fields. "
    "Clover takes nitrogen from the air and releases it into the soil, which the grass then uses. The team "
    "says farmers could cut fertiliser costs sharply, but warns that results may differ on dry soils, and plans "
    "a second trial in the south of the country.",
    "The national railway company announced on Monday that it will replace its paper tickets with a mobile "
    "app and rechargeable cards by the end of next year. Ticket machines will remain at the larger stations for "
    "travellers without a smartphone. Passenger groups welcomed the faster boarding but asked the company to "
    "keep staffed ticket desks open in rural areas, where many older travellers still pay in cash.",
    "A fire in a warehouse on the edge of the industrial district was brought under control early on "
    "Wednesday after burning for nearly six hours. No one was injured, as the building was empty at night. "
    "Firefighters from three neighbouring towns helped to stop the flames from reaching a paint factory next "
    "door. Residents were asked to keep their windows closed because of the smoke, and the cause of the fire "
    "is being investigated.",
    "The city's botanical garden has grown a rare mountain orchid from seed for the first time. The plant, "
    "which grows wild on only a few cliffs, needs a specific fungus in the soil to germinate. Gardeners spent "
    "four years finding the right conditions in the laboratory. Twenty young plants will be returned to their "
    "natural habitat next spring, and the rest will be shown to visitors in the glasshouse.",
    "Local elections will take place on the second Sunday of May, the electoral commission confirmed on "
    "Thursday. For the first time, residents will be able to vote at any polling station in their district "
    "instead of only at the one near their home. The commission expects higher turnout among young people and "
    "commuters. Postal voting applications must be received at least ten days before the election.",
    "A technology company based in the capital has agreed to buy a smaller rival that makes software for "
    "hospitals, for an undisclosed sum. The combined business will employ about two thousand people. The "
    "smaller company's founder will stay on to lead the hospital division. Competition regulators still have "
    "to approve the deal, which is expected to be completed in the autumn.",
    "After a decade of decline, the number of hedgehogs counted in the region's gardens rose for the second "
    "year in a row, according to a survey of volunteers. Experts credit a campaign that encouraged people to "
    "cut small holes in garden fences, letting the animals travel between gardens to find food and mates. "
    "More than eight thousand households took part in this year's count.",
]

WORD_PROBLEMS = [
    "A baker makes 24 muffins in each batch. She bakes 5 batches and sells 97 muffins. How many muffins are "
    "left?",
    "Tom has 3 boxes of pencils with 12 pencils in each box. He gives 8 pencils to his sister and shares the "
    "rest equally with his two friends and himself. How many pencils does each person get?",
    "A train leaves at 2:45 pm and the journey takes 1 hour and 50 minutes. At what time does it arrive?",
    "A garden is 12 metres long and 7 metres wide. A fence goes all the way around it. How many metres of fence "
    "are needed?",
    "Maria saves 15 dollars every week. How many weeks does she need to save to buy a bicycle that costs 180 "
    "dollars?",
    "A class has 28 students. Three quarters of them walk to school and the rest come by bus. How many "
    "students come by bus?",
    "A shop sells apples at 4 for 1 dollar. How much do 30 apples cost?",
    "A water tank holds 500 litres. It is filled at 25 litres per minute and starts empty. How long does it "
    "take to fill the tank halfway?",
]

# (the passage of PASSAGES that answers it, the question); the prompt shows it beside another passage
RAG_QUESTIONS = [
    (0, "Which two items did the tool lending shelf lend out most often?"),
    (1, "How does a honeybee show the distance to the food?"),
    (2, "What happens when two people change the same lines of a file?"),
    (3, "How often will the buses on route 11 run in the evening after the change?"),
    (4, "Why does sourdough need a long rise?"),
    (5, "How quickly does the engineer on call respond to an urgent problem?"),
    (6, "What are the ridges of debris that glaciers leave called?"),
    (7, "How long after delivery can an item be dropped at the post office for a return?"),
]

# chats whose last user turn asks about the earlier turns
CHATS = [
    [("user", "I'm planning a trip to Lisbon in April. Is that a good time to go?"),
     ("assistant", "Yes, April is a pleasant time: mild weather, around 20 degrees, fewer crowds than summer."),
     ("user", "Great. I also want to spend two days in Porto."),
     ("assistant", "Porto is about three hours from Lisbon by train, so two days there fits well."),
     ("user", "Summarise my travel plan so far, including the month and both cities.")],
    [("user", "My name is Priya and I'm learning to bake bread."),
     ("assistant", "Nice to meet you, Priya! Bread baking is rewarding. What have you tried so far?"),
     ("user", "A simple white loaf, but it came out dense."),
     ("assistant", "A dense loaf often means the dough did not rise long enough or was kneaded too little."),
     ("user", "What is my name, what did I bake, and what did you say might have gone wrong?")],
    [("user", "Write a Python function that returns the square of a number."),
     ("assistant", "```python\ndef square(x):\n    return x * x\n```"),
     ("user", "Now change it so that it also accepts a list and returns a list of squares. Show the whole "
      "function again.")],
    [("user", "I have three cats: Miso, Tofu and Nori."),
     ("assistant", "What lovely names! How old are they?"),
     ("user", "Miso is 5, Tofu is 3 and Nori is just 1."),
     ("assistant", "So you have quite an age range, from a kitten to an adult cat."),
     ("user", "List my cats from oldest to youngest with their ages.")],
    [("user", "Our team meeting is on Monday at 10 am in room B."),
     ("assistant", "Noted: Monday, 10 am, room B."),
     ("user", "Actually, it moved to Tuesday, same time, but in room D."),
     ("assistant", "Got it: Tuesday, 10 am, room D."),
     ("user", "Write a short message to the team with the final day, time and room of the meeting.")],
    [("user", "Give me three ideas for a birthday present for my father, who likes gardening."),
     ("assistant", "1. A good pair of pruning shears.\n2. A raised planter box.\n3. A book about growing "
      "vegetables."),
     ("user", "He already has shears. Which of your other ideas would you pick, and why?")],
    [("user", "Translate 'good morning' into French."),
     ("assistant", "'Good morning' in French is 'bonjour'."),
     ("user", "And 'thank you very much'?"),
     ("assistant", "'Thank you very much' is 'merci beaucoup'."),
     ("user", "Make a small table of the English phrases I asked about and their French translations.")],
    [("user", "I run 3 km on Monday, 5 km on Wednesday and 4 km on Friday."),
     ("assistant", "That's a solid routine with rest days in between."),
     ("user", "Next week I want to add 1 km to each run."),
     ("assistant", "Then next week you will run 4 km, 6 km and 5 km."),
     ("user", "How many kilometres will I run in total this week and next week? Show the steps.")],
]
