#!/bin/sh
# After install or upgrade (deb: configure; rpm: %post 1 or 2).
# The unit is not enabled here: a node that runs the plugin as a DaemonSet
# must not get a second one. `systemctl enable --now gpu-device-plugin`.
set -e
[ -d /run/systemd/system ] || exit 0
systemctl daemon-reload || true
case "$1" in
  configure) upgrade=${2:+yes} ;; # deb: $2 is the old version on upgrade
  2) upgrade=yes ;;               # rpm upgrade
  *) upgrade= ;;
esac
if [ -n "$upgrade" ]; then
  systemctl try-restart gpu-device-plugin.service || true
fi
exit 0
