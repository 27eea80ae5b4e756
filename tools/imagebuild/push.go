package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// PushTag parses the destination of a push. It must name a tag: pushing
// "latest" by accident, or a digest the image does not have, would leave
// the chart's image.tag pointing at something else.
func PushTag(ref string) (name.Tag, error) {
	if ref == "" {
		return name.Tag{}, errors.New("no image to push to: set IMAGE=registry.example.com/gpu-device-plugin:v0.1.0")
	}
	if strings.Contains(ref, "@") {
		return name.Tag{}, fmt.Errorf("image %q names a digest: push to a tag (registry/name:tag); the digest is printed after the push", ref)
	}
	// A colon before the last "/" is a registry's port, not a tag.
	if !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":") {
		return name.Tag{}, fmt.Errorf("image %q has no tag: add one, such as %s:v0.1.0", ref, ref)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image %q: %w", ref, err)
	}
	return tag, nil
}

// Push uploads the docker-archive tarball that Build writes to ref and
// returns the pushed manifest's digest. Credentials come from the default
// keychain (docker login, $DOCKER_CONFIG, credential helpers) and the
// transport honours HTTPS_PROXY and friends, as docker push would.
func Push(ctx context.Context, tarPath, ref string, opts ...remote.Option) (v1.Hash, error) {
	tag, err := PushTag(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if _, err := os.Stat(tarPath); err != nil {
		return v1.Hash{}, fmt.Errorf("the image tarball: %w (run make image first)", err)
	}
	// nil: the tarball must hold exactly one image, which Build writes.
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading %s: %w", tarPath, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading %s: %w", tarPath, err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.Write(tag, img, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing to %s: %w", tag, err)
	}
	return digest, nil
}
