package main

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// Push uploads what Build writes: the manifest the registry then serves
// has the tarball image's digest, layers included.
func TestPushRoundTrip(t *testing.T) {
	// No credentials of the machine's own: the registry wants none.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}

	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	// The tarball's own tag is make image's; the push goes elsewhere.
	if err := tarball.WriteToFile(tarPath, name.MustParseReference("ghcr.io/example/unpublished:v0.0.1").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	ref := u.Host + "/team/gpu-device-plugin:v0.1.0"
	got, err := Push(context.Background(), tarPath, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Push returned %s, the tarball's image is %s", got, want)
	}

	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(tag)
	if err != nil {
		t.Fatalf("pulling the manifest back: %v", err)
	}
	if desc.Digest != want {
		t.Errorf("the registry serves %s as %s, want %s", ref, desc.Digest, want)
	}
	pulled, err := desc.Image()
	if err != nil {
		t.Fatal(err)
	}
	// Reads every blob back and checks it against its digest: a layer or
	// config the push skipped fails here.
	if err := validate.Image(pulled); err != nil {
		t.Errorf("the pushed image: %v", err)
	}
}

func TestPushRefusesBadDestination(t *testing.T) {
	tarPath := filepath.Join(t.TempDir(), "missing.tar")
	for _, tc := range []struct{ name, ref, want string }{
		{"missing", "", "set IMAGE=registry.example.com/gpu-device-plugin:v0.1.0"},
		{"no tag", "registry.example.com/gpu-device-plugin", `"registry.example.com/gpu-device-plugin" has no tag`},
		{"port is not a tag", "localhost:5000/gpu-device-plugin", "has no tag"},
		{"digest", "registry.example.com/gpu-device-plugin@sha256:" + strings.Repeat("a", 64), "names a digest"},
		{"bad tag", "registry.example.com/gpu-device-plugin:v0.1.0!", "registry.example.com/gpu-device-plugin:v0.1.0!"},
		{"no tarball", "registry.example.com/gpu-device-plugin:v0.1.0", "run make image first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Push(context.Background(), tarPath, tc.ref)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Push(%q): %v, want an error containing %q", tc.ref, err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Push(%q): the error takes several lines: %q", tc.ref, err)
			}
		})
	}
}
