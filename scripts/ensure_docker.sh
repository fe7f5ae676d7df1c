#!/usr/bin/env bash
# Make sure a Docker engine answers. On Debian as root with none running: install
# docker.io (and mmdebstrap) and start dockerd in the background. Elsewhere: say what to install.
set -euo pipefail

answers() { docker info >/dev/null 2>&1; }

if answers; then exit 0; fi
if [ -n "${DOCKER_HOST:-}" ]; then
    echo "DOCKER_HOST=$DOCKER_HOST is set but no Docker engine answers there; start it or unset DOCKER_HOST." >&2
    exit 1
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "No Docker engine answers. Install and start Docker (https://docs.docker.com/engine/install/)," >&2
    echo "or point DOCKER_HOST at a running engine, then run this again." >&2
    exit 1
fi
# With mmdebstrap, which builds the base image where no registry answers (sandbox/images.py): 41-55 s for
# debootstrap's ~78 on this machine.
bash "$(dirname "$0")/ensure_packages.sh" "the Docker engine" dockerd=docker.io "mmdebstrap|debootstrap=mmdebstrap"
echo "Starting dockerd in the background (log: /var/log/handhold-dockerd.log)..."
# In its own session: it outlives the shell (and a Ctrl-C) that started it.
setsid nohup dockerd >/var/log/handhold-dockerd.log 2>&1 </dev/null &
for _ in $(seq 1 60); do
    if answers; then echo "Docker engine is up."; exit 0; fi
    sleep 1
done
echo "dockerd did not answer within 60 s; see /var/log/handhold-dockerd.log" >&2
exit 1
