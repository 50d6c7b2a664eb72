# Sourced by the other scripts: create .venv on first use and install watchproxy with $EXTRAS.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# constraints.txt pins the runtime stack to versions known to own their sockets correctly.
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[${EXTRAS}]"
