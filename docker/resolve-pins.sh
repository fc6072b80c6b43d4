#!/usr/bin/env bash
# Rewrites a versions.env in place with the values of those of its variables that are set (and
# non-empty) in the environment: in an image build, the Dockerfile's build arguments
# (`docker build --build-arg TORCH_GPU_VERSION=...`; scripts/build-image.sh passes none).
# The image keeps the result as /opt/dtc/src/versions.env: the pins it was built with, which the
# install scripts and the in-image tests read. A pin given so gets release date `unknown` (its
# <KEY>_RELEASED line, which follows it, is versions.env's date for versions.env's value).
# Usage: docker/resolve-pins.sh versions.env
set -euo pipefail
file="${1:?usage: resolve-pins.sh versions.env}"
tmp="$(mktemp)"
overridden=" "
while IFS= read -r line || [ -n "$line" ]; do
  if [[ "$line" =~ ^([A-Z][A-Z0-9_]*)_RELEASED=(.*)$ ]]; then
    if [[ "$overridden" == *" ${BASH_REMATCH[1]} "* ]]; then line="${BASH_REMATCH[1]}_RELEASED=unknown"; fi
  elif [[ "$line" =~ ^([A-Z][A-Z0-9_]*)=(.*)$ ]]; then
    key="${BASH_REMATCH[1]}"
    if [ -n "${!key:-}" ] && [ "${!key}" != "${BASH_REMATCH[2]}" ]; then
      printf '[resolve-pins] %s=%s (build argument; versions.env has %s)\n' "$key" "${!key}" "${BASH_REMATCH[2]}" >&2
      line="$key=${!key}"
      overridden+="$key "
    fi
  fi
  printf '%s\n' "$line" >> "$tmp"
done < "$file"
mv "$tmp" "$file"
chmod 0644 "$file"
