#!/bin/bash
# regenerate docs/saeot/eval/summary.md and paste its tables into docs/saeot.md
cd /work/wt/saeot
./dev saeot summarize docs/saeot/eval/eval_*.json $(ls docs/saeot/eval/disjoint_*.json 2>/dev/null) --select-pairs 9:18 --out docs/saeot/eval/summary.md > /dev/null
.venv/bin/python - <<'PY'
import re
s = open("docs/saeot.md").read()
t = open("docs/saeot/eval/summary.md").read()
t = "\n".join(l for l in t.splitlines() if not l.startswith("Validation means by configuration"))
a = s.index("<!-- pair-tables:begin"); a = s.index("\n", a) + 1
b = s.index("<!-- pair-tables:end -->")
open("docs/saeot.md", "w").write(s[:a] + t + "\n" + s[b:])
PY
