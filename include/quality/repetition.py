"""The degenerate-repetition filter: a completion caught in a loop.

Two signs, either enough:

- a tail loop: the text ends in one span repeated (``period`` characters, at least
  ``tail_min_repeats`` times, covering at least ``tail_min_chars``), the shape of a model
  that looped until ``max_tokens`` or until it happened to sample its stop token. Read off
  characters, so loops without spaces (``!!!!``, CJK, ``ababab``) are seen too;
- repeated word n-grams anywhere (a loop the model later broke out of): at least
  ``ngram_dup_fraction`` of the ``ngram_words``-grams are repeats *and* one of them occurs
  ``ngram_top_count`` times or more (counting only n-grams of ``ngram_min_distinct`` or more
  different words of two letters or more).

Legitimate repetition stays under both: code repeats lines but not a 10-word span a dozen
times over half its length; a table repeats separators and cells but its rows differ; a
matrix of zeros is a few rows, well under ``tail_min_chars``.
"""

from __future__ import annotations

from collections import Counter

from include.quality.parts import Parts, QualityOptions


def degenerate_repetition(parts: Parts, options: QualityOptions) -> str | None:
    """Return how the completion loops, or None."""
    # As written, and without trailing white space (a loop then one newline); a loop of
    # white space itself is seen only as written.
    stripped = parts.text.rstrip()
    for text in (parts.text, stripped) if stripped != parts.text else (parts.text,):
        loop = tail_loop(text[-options.tail_window_chars:], options.tail_min_repeats,
                         options.tail_min_chars, options.tail_max_period)
        if loop is not None:
            break
    if loop is not None:
        period, covered = loop
        unit = text[-period:]
        return (f"the last {covered} characters are a {period}-character span repeated "
                f"{covered / period:.0f} times: {unit[:40]!r}")
    found = None
    words = parts.text.split()
    if len(words) >= max(options.ngram_min_words, options.ngram_words) and _may_repeat(
            words, options.ngram_words, options.ngram_dup_fraction):
        found = _repeats(words, options.ngram_words, options.ngram_min_words,
                         options.ngram_min_distinct)
    if found is not None:
        fraction, top = found
        if fraction >= options.ngram_dup_fraction and top >= options.ngram_top_count:
            return (f"{fraction:.0%} of its {options.ngram_words}-word spans are repeats, "
                    f"one of them {top} times")
    return None


def tail_loop(text: str, min_repeats: int, min_chars: int, max_period: int
              ) -> tuple[int, int] | None:
    """Return ``(period, covered)`` of the shortest span repeated at the end of ``text``.

    ``covered`` counts every character of the repetition (the last copy may be partial, as in
    a cut loop); None unless some period repeats ``min_repeats`` times over ``min_chars``.
    C-speed string operations only: candidate periods from where the text's last characters
    recur, each checked against its own last copy, then a binary search for how far back
    the match runs (a longer matching suffix implies every shorter one).
    """
    n = len(text)
    if n < min_chars:
        return None
    # Candidate periods: where the last few characters occur again within max_period (found
    # by str.find, in C). Prose yields almost none; a loop yields its period and multiples.
    k = min(8, n // 2)
    tail = text[n - k:]
    periods = []
    at = text.find(tail, max(0, n - k - max_period), n - 1)
    while at != -1:
        periods.append(n - k - at)
        at = text.find(tail, at + 1, n - 1)
    for p in sorted(periods):
        if p > n // max(min_repeats, 2) or text[n - p:] != text[n - 2 * p: n - p]:
            continue
        lo, hi = p, n - p  # the suffix of length lo matches; find the longest that does
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text[n - mid:] == text[n - mid - p: n - p]:
                lo = mid
            else:
                hi = mid - 1
        covered = lo + p
        if covered >= min_chars and covered >= min_repeats * p:
            return p, covered
    return None


def ngram_repeats(text: str, n: int, min_words: int, min_distinct: int = 1
                  ) -> tuple[float, int] | None:
    """Return (share of word n-grams that repeat an earlier one, count of the commonest of
    those with at least ``min_distinct`` different words of two letters or more).

    None for a text of fewer than ``min_words`` words (too short to judge). The word floor
    keeps a matrix of zeros (``0 & 0 & 0``), a truth table (``| T | F |``) or a row of dashes
    from counting as a loop: a model's loop repeats a phrase or a sentence.
    """
    return _repeats(text.split(), n, min_words, min_distinct)


def _may_repeat(words: list[str], n: int, fraction: float) -> bool:
    """Return False only if under ``fraction`` of the word ``n``-grams can be repeats.

    Exact and cheap: an n-gram (n >= 2) that repeats an earlier one starts with a word pair
    that repeats an earlier one too, so the pairs' repeats bound the n-grams' from above;
    prose stays far under the bound, and the full count (tuples of n words) is skipped.
    """
    total = len(words) - n + 1
    if n < 2 or total <= 0:
        return True
    pair_repeats = len(words) - 1 - len(set(zip(words, words[1:], strict=False)))
    return pair_repeats / total >= fraction  # as the share is compared: no rounding gap


def _repeats(words: list[str], n: int, min_words: int, min_distinct: int
             ) -> tuple[float, int] | None:
    if len(words) < max(min_words, n):
        return None
    counts = Counter(zip(*(words[i:] for i in range(n)), strict=False))
    total = len(words) - n + 1
    top = max((c for gram, c in counts.items() if c > 1 and _wordy(gram) >= min_distinct),
              default=1)
    return (total - len(counts)) / total, top


def _wordy(gram: tuple[str, ...]) -> int:
    return len({w for w in gram if sum(map(str.isalpha, w)) >= 2})
