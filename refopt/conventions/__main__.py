"""``python -m refopt.conventions``: print the generated conventions page (docs/conventions_generated.md)."""
from refopt.conventions import markdown

print(markdown(), end="")
