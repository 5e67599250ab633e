#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored, carried to the remote GPU machine): wheels of the packages that machine lacks,
# pinned to this venv's versions (list from ../shared/docs/gpu-device.md), and a copy of WikiText-2.
#   bash tests/gpu/wheels.sh         then, on the device: bash tests/gpu/on_device.sh check|ship|bench (.gpu-study: study)
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude="$(git rev-parse --git-path info/exclude)"; mkdir -p "$(dirname "$exclude")"
grep -qxF /.gpu/ "$exclude" 2>/dev/null || echo /.gpu/ >> "$exclude"
mkdir -p .gpu/whl .gpu/data
PKGS="nbval nbformat nbclient jupyter_client jupyter_core ipykernel ipython ipython_pygments_lexers traitlets pyzmq
tornado comm matplotlib-inline parso prompt_toolkit pexpect ptyprocess decorator stack-data executing asttokens
pure_eval wcwidth platformdirs fastjsonschema jsonschema jsonschema-specifications referencing rpds-py ipywidgets
jupyterlab_widgets datasets dill multiprocess"
for p in $PKGS; do
  v=$(.venv/bin/pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
  [ -n "$v" ] || { echo "($p is not in .venv: this venv's versions do not need it)"; continue; }
  compgen -G ".gpu/whl/${p//-/_}-$v-*" >/dev/null && continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl "$p==$v"
done
cp -r "${MINIGATE_CORPORA_DIR:-../shared/data}/wikitext-2-raw" .gpu/data/
du -sh .gpu
# .gpu-study (GPU_DIR=.gpu-study for on_device.sh's `study`): the same less the notebook kernel's wheels, which that
# step does not need, to keep what travels to the device under 64 MiB with the checkout
grep -qxF /.gpu-study/ "$exclude" 2>/dev/null || echo /.gpu-study/ >> "$exclude"
rm -rf .gpu-study && mkdir -p .gpu-study/whl && cp -r .gpu/data .gpu-study/ && cp .gpu/whl/*.whl .gpu-study/whl/
rm -f .gpu-study/whl/{pyzmq,tornado,ipykernel,jupyter_client,nbclient,nbval}-*
du -sh .gpu-study
