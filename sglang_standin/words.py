"""Hold the bundled word list the stand-in writes completions from and trains its small BPE on.

Every entry is lowercase ASCII letters only: a space followed by such a word is exactly one
pre-token under Qwen's split pattern, so a completion built from these words tokenizes to the
concatenation of the words' own encodings (see `generation.py`).
"""

from __future__ import annotations

_WORD_TEXT = """
the of and to in is that it for as with was on be by this are at from or an have not
but which one all were can there been has more their if will when would what so no out
up into than them its only other some could time these two may then first any like now
new over such our also most after where used many well should between each through
because same those while under both long very make made even much must take before
see just way back three state need great good small large high part place case work
point number world group system order form fact hand water light sound level line
model data value result step answer question problem method reason idea example number
token batch queue server client request response shard record field table column file
path node graph tree list array map set key word text string code test check build run
start stop wait read write load save send store cache index count sum total rate speed
time second minute hour day week month year early late fast slow simple clear short
right left true false open close full empty free busy ready alive final given known
think thought consider suppose assume note recall observe compute derive verify solve
prove show find keep give call follow begin end turn move change grow reduce increase
first second third next last previous current every few several whole half double
because therefore however although unless whether since though thus hence indeed
perhaps likely maybe certain possible likely careful exact rough simple direct plain
function variable constant parameter argument output input length limit bound range
prime even odd square root factor product power sum difference ratio average median
context window prompt message reply draft target train learn evaluate measure sample
apple river stone cloud garden bridge market letter window valley forest candle mirror
north south east west winter summer autumn spring morning evening night noon moment
people person child friend teacher student doctor writer farmer builder sailor driver
city town village country island mountain ocean desert field harbor road street house
red blue green yellow black white brown gray silver golden bright dark warm cold soft
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))

# Words that end a sentence or clause; kept separate so completions read like prose.
PUNCTUATION: tuple[str, ...] = (".", ",", ";", ":", "?")


def training_corpus() -> list[str]:
    """Return deterministic training lines for the small BPE: prose-like, chat-like and numeric.

    Each word occurs after a space and capitalised at a line start, so the trained merges make
    most `" word"` units single tokens; digits and punctuation keep every byte class covered.
    """
    words = sorted(set(WORDS))
    lines: list[str] = []
    for rep in range(3):
        for i in range(0, len(words), 12):
            chunk = words[i : i + 12]
            sentence = " ".join(chunk)
            lines.append(sentence[0].upper() + sentence[1:] + PUNCTUATION[rep % 2] + "\n\n")
            lines.append(" " + " ".join(reversed(chunk)) + ", " + chunk[0] + ".")
        for word in words:
            lines.append(word.capitalize() + " " + word + " " + word.upper())
    lines.append(" ".join(str(n) for n in range(200)))
    lines.append("system user assistant tool\nHello! How are you? I'm fine, thanks.\n")
    lines.append("Let me think about this step by step.\n\nThe answer is 42.\n")
    return lines
