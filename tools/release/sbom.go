package release

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/uuid"
)

// Binary is one built executable the SBOM covers.
type Binary struct {
	Path     string
	Platform Platform
}

func setting(info *buildinfo.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// SBOM describes the release's binaries in CycloneDX: the product as the
// main component, each binary (per platform, with its SHA-256 and Go build
// settings) as an application, and the Go modules each was built from,
// the standard library included, as libraries with their go.sum hash.
// Everything comes from the binaries' own build information, so it lists
// what was linked, not what go.mod allows. created dates it; the same
// binaries give the same document.
func SBOM(release string, binaries []Binary, created time.Time) (*cdx.BOM, error) {
	mainRef := purl("github.com/gpu-device-plugin/gpu-device-plugin", release, "")
	bom := cdx.NewBOM()
	bom.Metadata = &cdx.Metadata{
		Timestamp: created.UTC().Format(time.RFC3339),
		Component: &cdx.Component{
			BOMRef: mainRef, Type: cdx.ComponentTypeApplication, Name: Name, Version: release, PackageURL: mainRef,
			Description: "Kubernetes device plugin for NVIDIA GPUs",
			Licenses:    &cdx.Licenses{{License: &cdx.License{ID: "Apache-2.0"}}},
		},
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "releasebuild",
			Description: "gpu-device-plugin's tools/releasebuild: reads the binaries' Go build information, writes with github.com/CycloneDX/cyclonedx-go",
		}}},
	}
	modules := map[string]cdx.Component{}
	var apps []cdx.Component
	var deps []cdx.Dependency
	var appRefs []string
	serial := sha256.New()
	for _, b := range binaries {
		info, err := buildinfo.ReadFile(b.Path)
		if err != nil {
			return nil, fmt.Errorf("reading the Go build information of %s: %w", b.Path, err)
		}
		content, err := os.ReadFile(b.Path)
		if err != nil {
			return nil, err
		}
		sum := sha256Hex(content)
		// What the binary reports; "" where it cannot be read, which
		// Verify then names.
		stamped, _ := StampedVersion(content, release)
		fmt.Fprintln(serial, b.Platform, filepath.Base(b.Path), sum)
		name := filepath.Base(b.Path)
		ref := purl(info.Path, stamped, "?goarch="+b.Platform.Arch+"&goos="+b.Platform.OS)
		props := []cdx.Property{
			{Name: "cdx:gomod:binary:name", Value: name},
			{Name: "cdx:gomod:build:env:GOOS", Value: b.Platform.OS},
			{Name: "cdx:gomod:build:env:GOARCH", Value: b.Platform.Arch},
			{Name: "cdx:gomod:build:env:CGO_ENABLED", Value: setting(info, "CGO_ENABLED")},
			{Name: "cdx:gomod:toolchain:version", Value: info.GoVersion},
		}
		apps = append(apps, cdx.Component{
			BOMRef: ref, Type: cdx.ComponentTypeApplication, Name: name, Version: stamped, PackageURL: ref,
			Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}}, Properties: &props,
		})
		appRefs = append(appRefs, ref)

		std := cdx.Component{Type: cdx.ComponentTypeLibrary, Name: "std", Version: info.GoVersion}
		std.BOMRef = purl("std", info.GoVersion, "")
		std.PackageURL = std.BOMRef
		modules[std.BOMRef] = std
		uses := []string{std.BOMRef}
		for _, m := range info.Deps {
			if m.Replace != nil {
				m = m.Replace
			}
			c := cdx.Component{Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version, Scope: cdx.ScopeRequired}
			c.BOMRef = purl(m.Path, m.Version, "")
			c.PackageURL = c.BOMRef
			if h, ok := h1SHA256(m.Sum); ok {
				c.Hashes = &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: h}}
			}
			modules[c.BOMRef] = c
			uses = append(uses, c.BOMRef)
		}
		sort.Strings(uses)
		deps = append(deps, cdx.Dependency{Ref: ref, Dependencies: &uses})
	}
	refs := make([]string, 0, len(modules))
	for r := range modules {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	components := apps
	for _, r := range refs {
		components = append(components, modules[r])
		deps = append(deps, cdx.Dependency{Ref: r})
	}
	deps = append([]cdx.Dependency{{Ref: mainRef, Dependencies: &appRefs}}, deps...)
	bom.Components = &components
	bom.Dependencies = &deps
	bom.SerialNumber = uuid.NewSHA1(uuid.NameSpaceURL, append([]byte(mainRef), serial.Sum(nil)...)).URN()
	return bom, nil
}

// WriteSBOM encodes bom as indented JSON.
func WriteSBOM(w io.Writer, bom *cdx.BOM) error {
	return cdx.NewBOMEncoder(w, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom)
}

// ReadSBOM decodes a CycloneDX JSON document.
func ReadSBOM(file string) (*cdx.BOM, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		return nil, fmt.Errorf("%s is not a CycloneDX JSON document: %w", filepath.Base(file), err)
	}
	return &bom, nil
}

// purl is a Go module's package URL: pkg:golang/<path>@<version><qualifiers>.
func purl(path, version, qualifiers string) string {
	p := "pkg:golang/" + path
	if version != "" {
		p += "@" + version
	}
	return p + qualifiers
}

// h1SHA256 turns a go.sum hash (h1:, base64 SHA-256 of the module's file
// list) into hex, as CycloneDX wants hashes.
func h1SHA256(sum string) (string, bool) {
	b64, ok := strings.CutPrefix(sum, "h1:")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != sha256.Size {
		return "", false
	}
	return hex.EncodeToString(b), true
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
