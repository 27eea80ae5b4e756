#!/bin/sh
# After removal (deb: remove or purge; rpm: %postun 0).
set -e
[ -d /run/systemd/system ] || exit 0
systemctl daemon-reload || true
exit 0
