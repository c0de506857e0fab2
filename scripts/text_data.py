"""Writes `examples/data/kjv.txt`: about 1 MB of plain ASCII prose from the King James Bible (1611),
as shipped in Debian's `bible-kjv-text` package and read out with its `bible` program.

The text is the contiguous prefix of the Bible, in whole books, that first reaches 1,000,000 bytes:
Genesis to Judges, the first seven books. Clean-up: no book/chapter/verse numbers; each book
starts with a line holding its name; each chapter is one paragraph (its verses joined by single
spaces); paragraphs are separated by one blank line. The text itself is kept as the package has it (already ASCII).

Run (from the repository root, on Debian or Ubuntu; CI never runs this):
  apt-get install bible-kjv          # pulls in bible-kjv-text, the compressed text
  python3 scripts/text_data.py
"""
import argparse
import os
import re
import shutil
import subprocess

TARGET = 1_000_000   # stop at the first book end at or past this many bytes
LIMIT = 1_200_000    # never more than this


def dump():
    """The whole Bible from `bible`, pretty-printed with no line wrapping: a line 'Book N' at each
    chapter, then one line '  V text' per verse."""
    if shutil.which("bible") is None:
        raise SystemExit("`bible` not found: apt-get install bible-kjv")
    out = subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"], check=True,
                         capture_output=True).stdout
    return out.decode("ascii")


def chapters(text):
    """Yields (book, chapter, [verse texts]) in order."""
    heading = re.compile(r"^(.+) (\d+)$")
    verse = re.compile(r"^ +(\d+) (.+)$")
    book = number = None
    verses = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = verse.match(line)
        if m:
            assert int(m.group(1)) == len(verses) + 1, line
            verses.append(m.group(2).strip())
            continue
        m = heading.match(line)
        assert m, f"unexpected line {line!r}"
        if verses:
            yield book, number, verses
        book, number, verses = m.group(1), int(m.group(2)), []
    if verses:
        yield book, number, verses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples/data/kjv.txt")
    args = parser.parse_args()

    parts, size, last_book, end = [], 0, None, None
    for book, number, verses in chapters(dump()):
        if book != last_book:
            if size >= TARGET:
                break
            piece = ("" if last_book is None else "\n") + book + "\n\n"
            last_book = book
        else:
            piece = "\n"
        piece += " ".join(verses) + "\n"
        assert size + len(piece) <= LIMIT, "the text would pass the limit"
        parts.append(piece)
        size += len(piece)
        end = f"{book} {number}"
    text = "".join(parts)
    assert text.isascii() and not re.search(r"\d+:\d+", text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    print(f"wrote {args.out}: Genesis 1 to {end}, {len(text)} bytes, "
          f"{text.count(chr(10))} lines, {len(set(text))} distinct characters")


if __name__ == "__main__":
    main()
