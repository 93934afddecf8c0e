# The generated blocks of docs/saeot.md: text between `<!-- NAME:begin ... -->` and `<!-- NAME:end -->`,
# rewritten by the fill_a*.py scripts (run from the repo root).
from pathlib import Path

doc = Path("docs/saeot.md")


def block(name, text):
    s = doc.read_text()
    a = s.index(f"<!-- {name}:begin")
    a = s.index("\n", a) + 1
    b = s.index(f"<!-- {name}:end -->")
    doc.write_text(s[:a] + text.rstrip() + "\n" + s[b:])
