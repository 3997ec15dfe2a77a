#!/usr/bin/env bash
# Installs the Python client's packages (grpcio, grpcio-tools, protobuf; pinned in
# requirements.txt) into examples/python/.pyenv and generates the stubs from proto/tensortune.proto
# into examples/python/.pyenv/stubs. Idempotent; prints the PYTHONPATH to use.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
env="$here/.pyenv"
if [ ! -f "$env/.installed" ] || ! cmp -s "$here/requirements.txt" "$env/.installed"; then
  rm -rf "$env"
  python3 -m pip install --quiet --disable-pip-version-check --target "$env/site" -r "$here/requirements.txt" >&2
  cp "$here/requirements.txt" "$env/.installed"
fi
stubs="$env/stubs"
if [ ! -f "$stubs/tensortune_pb2.py" ] || [ "$root/proto/tensortune.proto" -nt "$stubs/tensortune_pb2.py" ]; then
  mkdir -p "$stubs"
  PYTHONPATH="$env/site" python3 -m grpc_tools.protoc -I "$root/proto" \
    --python_out="$stubs" --grpc_python_out="$stubs" "$root/proto/tensortune.proto"
fi
echo "$stubs:$env/site"
