#!/bin/sh
# After removal (deb: remove or purge; rpm: %postun 0) and after an upgrade
# (deb: upgrade; rpm: %postun 1), which must keep everything.
set -e
case "$1" in
  remove|purge|0)
    # The plugin leaves its CDI specs when it stops (the kubelet restarts
    # containers with the CDI names it checkpointed); with the plugin gone,
    # nothing serves those devices, so runtimes must stop resolving them.
    # Its own files only: other vendors' specs stay. /var/run/cdi is the
    # one spec directory the unit lets it write (ReadWritePaths=).
    rm -f /var/run/cdi/gpu-device-plugin_*.json /var/run/cdi/gpu-device-plugin_*.yaml
    ;;
esac
[ -d /run/systemd/system ] || exit 0
systemctl daemon-reload || true
exit 0
