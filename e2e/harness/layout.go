package harness

// Layout is a distribution's library directory, as container images lay
// it out: GPU containers must find CUDA whichever the image is.
type Layout struct {
	Name   string
	LibDir string
}

// The two library layouts of images in use.
var (
	Debian = Layout{"debian", "/usr/lib/x86_64-linux-gnu"}
	RHEL   = Layout{"rhel", "/usr/lib64"}
)
