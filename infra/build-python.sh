#!/bin/sh
# Prints an interpreter that can import hardcap_core with its dependencies, for the build steps
# that run the package's own code (config validation, the validated copy, the vocabulary prune).
#
#   infra/build-python.sh LOCK VENV PYTHON [PYTHON313]
#
# The `python3` that `sam build` runs make with is the SAM CLI's (a venv with the SAM CLI and
# nothing of ours), so it usually cannot. Then a venv of the build's own is made once at VENV
# with exactly the lock's pins (the versions the function runs with), from PYTHON313 when one is
# installed (the runtime's Python) or else PYTHON, and made again when the lock changes.
# $BUILD_PYTHON, when set, is used as it is. Anything that goes wrong stops the build: a config
# that was not validated must never be deployed silently. Progress goes to stderr.
set -eu
lock=$1 venv=$2 python=$3 python313=${4:-}
probe='import hardcap_core.config.schema, hardcap_core.config.loader, hardcap_core.tokenize.vocabularies'

fail() {
	echo "build: $*" >&2
	echo "build: set BUILD_PYTHON to a Python >= 3.11 that has the project installed" \
		"(pip install -e .), or fix the above; nothing was deployed" >&2
	exit 1
}

if [ -n "${BUILD_PYTHON:-}" ]; then
	"$BUILD_PYTHON" -c "$probe" || fail "BUILD_PYTHON=$BUILD_PYTHON cannot import hardcap_core"
	echo "$BUILD_PYTHON"
	exit 0
fi
if "$python" -c "$probe" 2>/dev/null; then
	echo "$python"
	exit 0
fi

# sam builds the functions at the same time: one of them makes the venv, the others wait.
mkdir -p "$(dirname "$venv")"
waited=0
until mkdir "$venv.lock" 2>/dev/null; do
	[ "$waited" -lt 900 ] || fail "$venv.lock held for 15 minutes (a build killed midway?): remove it"
	sleep 1
	waited=$((waited + 1))
done
trap 'rmdir "$venv.lock"' EXIT

want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$venv/.lock-sha256" 2>/dev/null || true)" != "$want" ]; then
	base=${python313:-$python}
	"$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| fail "$base is older than Python 3.11, which hardcap_core needs"
	echo "build: $python cannot import hardcap_core's dependencies (the SAM CLI's venv);" \
		"making $venv from $lock with $base (once per lock)" >&2
	# Made beside its place and moved in, so an interrupted build never leaves half a venv.
	tmp="$venv.tmp.$$"
	rm -rf "$tmp"
	"$base" -m venv "$tmp" || fail "cannot make a venv with $base"
	"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
		--require-hashes --only-binary=:all: -r "$lock" \
		|| { rm -rf "$tmp"; fail "cannot install $lock into $tmp"; }
	echo "$want" >"$tmp/.lock-sha256"
	rm -rf "$venv"
	mv "$tmp" "$venv"
fi
"$venv/bin/python" -c "$probe" || fail "$venv/bin/python cannot import hardcap_core"
echo "$venv/bin/python"
