package dpnode

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestSocketAdvice(t *testing.T) {
	err := socketAdvice(fmt.Errorf("listening on /x/nvidia-gpu.sock: %w", fs.ErrPermission))
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "run as root, or set devicePluginDir (--device-plugin-dir)") {
		t.Errorf("err = %v", err)
	}
	other := errors.New("other")
	if socketAdvice(other) != other {
		t.Error("advice added to an unrelated error")
	}
}
