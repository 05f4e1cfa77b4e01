"""Arguments that must reach a command exactly as given."""

import sys


ECHO_ARGV = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


HOSTILE = ["", " ", "'", '"', "$(touch /tmp/orch-pwned)", "`id`", "; rm -rf /", "a && b", "a\nb",
           "\t", "*", "-n", "--", "ünïcødé ✓", "\\", "${HOME}", "|", ">", "%s%%"]
