#!/usr/bin/env bash
# Installs the reference daisy==2.0.0 into the environment of PYTHON, for the compatibility tests.
#
# Usage: .ci/install_anchors.sh PYTHON
#
# It never changes what is already installed: a dry run first lists what pip would do, and if that would
# replace an installed distribution (zarr, numpy, funlib.geometry, ...) with another version, nothing is
# installed. Any failure prints a warning and exits 0, so the tests that need daisy skip instead of failing.
set -uo pipefail

PY=${1:-}
SPEC="daisy==2.0.0"

warn() {
    echo "warning: .ci/install_anchors.sh: $*; tests that compare against daisy 2.0.0 will be skipped" >&2
    exit 0
}

[ -n "$PY" ] || warn "usage: $0 PYTHON"
command -v "$PY" >/dev/null 2>&1 || [ -x "$PY" ] || warn "no python at '$PY'"

if "$PY" -c 'import sys, daisy; sys.exit(0 if getattr(daisy, "__version__", "") == "2.0.0" else 1)' \
        >/dev/null 2>&1; then
    echo "daisy 2.0.0 already installed for $PY"
    exit 0
fi

"$PY" -m pip --version >/dev/null 2>&1 || warn "pip is not available for $PY"

report=$(mktemp)
trap 'rm -f "$report"' EXIT
if ! "$PY" -m pip install --quiet --dry-run --report "$report" "$SPEC" >/dev/null 2>&1; then
    warn "pip cannot resolve $SPEC"
fi

# Refuse when the resolution would replace an installed distribution with a different version.
if ! "$PY" - "$report" <<'EOF'
import json
import sys
from importlib import metadata


def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")


installed = {norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
with open(sys.argv[1]) as f:
    report = json.load(f)
changes = []
for item in report.get("install", []):
    meta = item.get("metadata", {})
    name, version = norm(meta.get("name", "")), meta.get("version", "")
    if name in installed and installed[name] != version:
        changes.append(f"{name} {installed[name]} -> {version}")
if changes:
    print("installing daisy 2.0.0 would change: " + ", ".join(changes), file=sys.stderr)
    sys.exit(1)
print("would install: " + ", ".join(
    f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report.get("install", [])))
EOF
then
    warn "refusing to change installed packages"
fi

"$PY" -m pip install --quiet "$SPEC" >/dev/null 2>&1 || warn "pip install $SPEC failed"
if ! "$PY" -c 'import daisy; assert daisy.__version__ == "2.0.0", daisy.__version__' >/dev/null 2>&1; then
    warn "daisy 2.0.0 was installed but does not import"
fi
echo "installed daisy 2.0.0 for $PY"
