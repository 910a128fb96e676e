#!/usr/bin/env bash
# Install everything arnar needs on a fresh Debian machine: Debian packages (synthesizers,
# voices, text sources), a virtualenv in .venv and the exact Python stack of requirements.lock.
# Idempotent: a second run checks and installs nothing new ("already installed" lines only).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  festival flite sox espeak-ng                                     # synthesizers + audio tool
  festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts            # festival English voices
  wordnet-base sword-text-web diatheke                             # freely licensed sentences
  git                                                              # dvc needs a git checkout
  chromium                                                         # tests: the HTML report renders
  munge slurmctld slurmd slurm-client                              # tests: a one-node SLURM (test_slurm.py)
)
PIP_VERSION=25.3
VENV=.venv

say() { printf 'setup: %s\n' "$*"; }

# --- Debian packages --------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "apt: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "apt: all ${#APT_PACKAGES[@]} packages already installed"
fi

# --- virtualenv -------------------------------------------------------------------------
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup: error: Python 3.11 is required (the pinned torch 2.13.0 CPU wheel is cp311); got $("$python" --version 2>&1)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "venv: creating $VENV"
  "$python" -m venv "$VENV"
fi

# --- Python packages, exactly as locked ---------------------------------------------------
# The stamp holds a hash of everything that decides what gets installed; equal hash = nothing to do.
stamp="$VENV/.arnar-setup"
want=$(cat requirements.lock requirements-nodeps.lock pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  say "python: $VENV already matches requirements.lock"
  exit 0
fi
pip_cmd=("$VENV/bin/python" -m pip --disable-pip-version-check)
# This machine kind's pip config lists local index folders that may not exist; pip then warns
# once per package. Drop that one warning, keep everything else (and pip's exit status).
pip() { "${pip_cmd[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
say "python: installing requirements.lock into $VENV"
pip install --quiet "pip==$PIP_VERSION"
# --no-deps: the lock is the complete set, resolved once by scripts/lock.sh.
pip install --quiet --no-deps -r requirements.lock
pip install --quiet --no-deps -r requirements-nodeps.lock
pip install --quiet --no-deps --no-build-isolation -e .

# torchaudio's PyPI wheels are CUDA builds whose extension libraries need libc10_cuda.so, which
# the CPU torch does not have. Without those files torchaudio imports in its documented
# pure-Python mode (torchaudio._extension: no library found -> extension unavailable), which is
# all s3tokenizer and descript-audiotools use. arnar itself never imports torchaudio.
ta_lib=$("$VENV/bin/python" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("torchaudio")
print(pathlib.Path(spec.origin).parent / "lib")
PY
)
rm -f "$ta_lib"/*.so
"$VENV/bin/python" -c 'import torchaudio, dac, s3tokenizer' \
  || { echo "setup: error: torchaudio/dac/s3tokenizer do not import; see README developer notes" >&2; exit 1; }

echo "$want" > "$stamp"
say "python: done ($(pip list --format=freeze | wc -l) packages)"
