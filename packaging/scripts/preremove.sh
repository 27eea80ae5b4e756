#!/bin/sh
# Before removal (deb: remove; rpm: %preun 0). An upgrade keeps it running.
set -e
[ -d /run/systemd/system ] || exit 0
case "$1" in
  remove|0) systemctl disable --now gpu-device-plugin.service || true ;;
esac
exit 0
