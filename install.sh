#!/usr/bin/env bash
# Sets up this machine for agents-sandbox: installs the Docker engine and git when they are
# missing (Debian/Ubuntu, apt), starts the engine when none answers, and builds agents-sandbox
# (static, CGO_ENABLED=0) into ${PREFIX:-/usr/local}/bin. Needs Go >= 1.26 on PATH or at
# /usr/local/go. Run it as root or with sudo available.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PREFIX=${PREFIX:-/usr/local}
SUDO=""
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null 2>&1 || { echo "install.sh: run as root, or install sudo" >&2; exit 1; }
	SUDO=sudo
fi
PATH=$PATH:/usr/local/go/bin

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v git >/dev/null 2>&1 || need+=(git)
if [ "${#need[@]}" -gt 0 ]; then
	command -v apt-get >/dev/null 2>&1 || { echo "install.sh: please install ${need[*]} with your package manager" >&2; exit 1; }
	echo "install.sh: installing ${need[*]}" >&2
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi

if ! timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
	if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
		$SUDO systemctl start docker
	else
		echo "install.sh: starting dockerd in the background (log: /tmp/dockerd.log)" >&2
		$SUDO sh -c 'nohup dockerd >/tmp/dockerd.log 2>&1 &'
	fi
	for _ in $(seq 60); do
		timeout 5 docker version >/dev/null 2>&1 && break
		sleep 1
	done
	timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
		{ echo "install.sh: the Docker engine does not answer; see /tmp/dockerd.log" >&2; exit 1; }
fi

command -v go >/dev/null 2>&1 || { echo "install.sh: Go >= 1.26 is needed to build agents-sandbox (https://go.dev/dl)" >&2; exit 1; }
echo "install.sh: building agents-sandbox" >&2
CGO_ENABLED=0 go build -trimpath -o bin/agents-sandbox ./cmd/agents-sandbox
$SUDO install -m 0755 bin/agents-sandbox "$PREFIX/bin/agents-sandbox"
echo "install.sh: installed $PREFIX/bin/agents-sandbox" >&2
"$PREFIX/bin/agents-sandbox" doctor || true
