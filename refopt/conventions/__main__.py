"""``python -m refopt.conventions``: print the generated conventions page (docs/conventions_generated.md);
``python -m refopt.conventions --presets FILE``: rewrite the generated presets table in FILE (docs/crosscheck.md)
between its two marker lines."""
import sys

from refopt.conventions import PRESETS_BEGIN, PRESETS_END, markdown, presets_markdown

if len(sys.argv) == 3 and sys.argv[1] == "--presets":
    with open(sys.argv[2], encoding="utf-8") as f:
        text = f.read()
    if text.count(PRESETS_BEGIN) != 1 or text.count(PRESETS_END) != 1:
        sys.exit(f"{sys.argv[2]}: needs exactly one line {PRESETS_BEGIN!r} and one {PRESETS_END!r}")
    head, rest = text.split(PRESETS_BEGIN)
    tail = rest.split(PRESETS_END, 1)[1]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write(head + presets_markdown().rstrip("\n") + tail)
elif len(sys.argv) == 1:
    print(markdown(), end="")
else:
    sys.exit("usage: python -m refopt.conventions [--presets FILE]")
