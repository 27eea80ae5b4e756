// Command gpu-device-plugin-cdi-hook is the OCI createContainer hook that the plugin's CDI
// specs run: it adds the libcuda.so link and updates the ld cache in each GPU container.
// See package ocihook.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/ocihook"
)

// Set at link time: -ldflags "-X main.version=v1.2.3 -X main.commit=abc".
var (
	version = "dev"
	commit  = "unknown"
)

const usage = `usage:
  gpu-device-plugin-cdi-hook create-container [--link TARGET::LINK]... [--folder DIR]...
      the OCI createContainer hook; reads the container state on stdin
  gpu-device-plugin-cdi-hook install --dir DIR
      copy this executable to DIR/gpu-device-plugin-cdi-hook, atomically
  gpu-device-plugin-cdi-hook version
`

func main() {
	// First of all: nothing the runtime left open or set reaches what follows. The
	// launcher keeps the two pipes the sandbox hands it.
	var keep []int
	if len(os.Args) > 1 && os.Args[1] == "ldconfig" {
		keep = []int{3, 4}
	}
	if err := ocihook.CleanProcess(os.Args, keep...); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", ocihook.Name, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run returns the exit status: 0, 1 when the command failed, 2 for bad usage.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(ocihook.Name+" "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var err error
	switch cmd {
	case "create-container", "sandbox": // sandbox: internal, started by create-container
		var req ocihook.Request
		fs.Func("link", "`TARGET::LINK`: create the symlink LINK (absolute, in the container) to TARGET; repeatable", func(s string) error {
			l, err := ocihook.ParseLink(s)
			req.Links = append(req.Links, l)
			return err
		})
		fs.Func("folder", "library `DIR` (absolute, in the container) to add to the ld cache; repeatable", func(s string) error {
			dir, err := ocihook.ParseFolder(s)
			req.Folders = append(req.Folders, dir)
			return err
		})
		rootfs := fs.String("rootfs", "", "internal: the container's rootfs, for sandbox")
		if code, ok := parse(fs, args); !ok {
			return code
		}
		if cmd == "sandbox" {
			err = ocihook.Sandbox(*rootfs, req, stderr)
		} else {
			err = ocihook.CreateContainer(ctx, req, stdin, stderr)
		}
	case "ldconfig": // internal: the confined launcher of the image's ldconfig, started by sandbox
		var folders []string
		fs.Func("folder", "library `DIR` to pass to ldconfig; repeatable", func(s string) error {
			dir, err := ocihook.ParseFolder(s)
			folders = append(folders, dir)
			return err
		})
		rootfs := fs.String("rootfs", "", "the container's rootfs")
		uid := fs.Int("uid", 0, "the uid and gid to run ldconfig as")
		if code, ok := parse(fs, args); !ok {
			return code
		}
		if *uid <= 0 {
			fmt.Fprintln(stderr, "ldconfig: --uid must be a positive uid")
			return 2
		}
		err = ocihook.Ldconfig(*rootfs, *uid, folders)
		if errors.Is(err, ocihook.ErrAborted) {
			return 0
		}
		cmd = "confining the image's ldconfig"
	case "install":
		dir := fs.String("dir", "", "`DIR` to copy the executable into (created if missing)")
		if code, ok := parse(fs, args); !ok {
			return code
		}
		if *dir == "" {
			fmt.Fprintln(stderr, "install: --dir is required")
			return 2
		}
		err = ocihook.Install(*dir)
	case "version":
		if code, ok := parse(fs, args); !ok {
			return code
		}
		fmt.Fprintf(stdout, "%s %s\ncommit: %s\ngo:     %s\n", ocihook.Name, version, commit, runtime.Version())
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s", cmd, usage)
		return 2
	}
	var refusal *ocihook.Refusal
	switch {
	case err == nil:
		return 0
	case errors.As(err, &refusal):
		fmt.Fprintf(stderr, "%s: %v\n", ocihook.Name, err)
		return ocihook.ExitRefused
	case errors.Is(err, ocihook.ErrRefused):
		return 1 // the sandbox has said why, in one line
	}
	fmt.Fprintf(stderr, "%s: %s: %v\n", ocihook.Name, cmd, err)
	return 1
}

// parse parses flags and refuses positional arguments; ok is false when run should return code.
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false // flag has printed the error, naming the argument, and the usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, false
	}
	return 0, true
}
