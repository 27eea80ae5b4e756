package remedy

// diagram is the state machine in Mermaid, for docs/health.md. A test
// checks that it names every state.
const diagram = `stateDiagram-v2
    [*] --> serving
    serving --> watching: a fault health alone handles, or resets are off
    watching --> serving: healthy again
    serving --> draining: a fault calls for a reset or a drain (withhold)
    watching --> draining: a fault calls for a reset or a drain (withhold)
    draining --> waitingIdle: no holder left (evicted after gracePeriod where allowed)
    waitingIdle --> draining: a holder again
    waitingIdle --> resetting: no process, MPS stopped (reset, peers with it where required)
    waitingIdle --> probing: a drain only, idle and the driver done (probe)
    resetting --> probing: reset done (probe), or found resetting after a restart
    resetting --> needsHuman: reset failed, or found resetting after a restart with the GPU gone
    probing --> serving: probe passed (give back)
    probing --> needsHuman: probe failed
    probing --> draining: a new fault calling for a reset came while probing
    serving --> needsHuman: a fault for a human (row remap failure, xid 64)
    draining --> needsHuman: budget spent, or peers must be reset with it and resetPeers is off
    serving --> needsReboot: GPU lost, xid 79, the driver asks for a reboot
    draining --> needsReboot: a fault calls for a reboot
    needsHuman --> needsReboot: a fault calls for a reboot
    needsHuman --> serving: a human's release (remediation release)
    needsReboot --> serving: a human's release (remediation release), or a reboot
`

// Diagram is the state diagram in Mermaid (stateDiagram-v2), from which
// docs/health.md is generated. The withheld states are all but serving and
// watching.
func Diagram() string { return diagram }
