# Sourced by scripts/train and scripts/test: make sure a virtual environment with jaxnet and the
# Fashion-MNIST data exists, creating or updating it when needed. Sets ROOT and VENV.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="${JAXNET_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

die() { echo "error: $*" >&2; exit 2; }

ensure_env() {
  if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python >= 3.11 or set PYTHON=/path/to/python3"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || die "jaxnet needs Python >= 3.11, $PYTHON is $("$PYTHON" --version 2>&1); set PYTHON=/path/to/python3.11"
    echo "creating a virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # Reinstall only when the declared dependencies change.
  local want have
  want=$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)
  have=$(cat "$VENV/.jaxnet-installed" 2>/dev/null || true)
  if [ "$want" != "$have" ]; then
    echo "installing jaxnet and its dependencies into $VENV (about a minute the first time)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$ROOT/constraints.txt" -e "$ROOT[test]"
    echo "$want" > "$VENV/.jaxnet-installed"
  fi
}

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package: installed system-wide when we
# are root, otherwise unpacked under ~/.local/share/jaxnet/datasets (where jaxnet also looks).
ensure_fashion_mnist() {
  local system=/usr/share/datasets/fashion-mnist
  local user_root="$HOME/.local/share/jaxnet/datasets"
  [ -d "$system" ] || [ -d "$user_root$system" ] && return 0
  command -v apt-get >/dev/null || {
    echo "warning: Fashion-MNIST not found and apt-get is missing; pass data.dir=DIR to jaxnet" >&2; return 0; }
  echo "installing Fashion-MNIST (Debian package dataset-fashion-mnist, 31 MB)"
  if [ "$(id -u)" = 0 ]; then
    apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null; }
  else
    local tmp; tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download dataset-fashion-mnist >/dev/null) \
      || die "could not download dataset-fashion-mnist; ask an administrator to run 'apt-get install dataset-fashion-mnist'"
    mkdir -p "$user_root" && dpkg -x "$tmp"/dataset-fashion-mnist_*.deb "$user_root"
    rm -rf "$tmp"
  fi
}

ensure_env
ensure_fashion_mnist
