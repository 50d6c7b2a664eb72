# Sourced by the other scripts: create .venv on first use and install watchproxy with $EXTRAS.
#
# pip runs only when the venv is missing, when what it was installed from has changed (this
# file, pyproject.toml, constraints.txt) or for extras not yet installed: a demo or test run on
# an up-to-date venv makes no network request and prints nothing. The install is editable (a
# .pth file, see pyproject.toml's package-dir): the checkout goes on the venv's path, so code
# changes need no reinstall, and the fake apiserver, the benchmarks and the tests (which the
# wheel does not ship) import from it.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
_stamp=.venv/.watchproxy-installed  # line 1: the inputs' digest; then one installed extra a line
_digest="$(cat scripts/venv.sh pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
_extra="${EXTRAS:-none}"
if [ ! -x .venv/bin/python ] || [ "$(head -n 1 "$_stamp" 2>/dev/null)" != "$_digest" ]; then
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    rm -f "$_stamp"
fi
# The test extra holds everything the demo extra does (trustme).
if ! tail -n +2 "$_stamp" 2>/dev/null | grep -qx -e "$_extra" -e "${_extra/#demo/test}"; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # constraints.txt pins the runtime stack to versions known to own their sockets correctly.
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[${EXTRAS:-}]"
    [ -f "$_stamp" ] || echo "$_digest" > "$_stamp"
    echo "$_extra" >> "$_stamp"
fi
unset _stamp _digest _extra
