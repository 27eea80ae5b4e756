package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Load reads a YAML file over the defaults. Unknown keys are errors, so a
// typo cannot silently leave a setting at its default; so are keys that
// differ from a known one only in case, which the JSON decoder underneath
// would otherwise accept, letting one of two spellings win. Each key is
// decoded on its own so that every error names its key.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Default(), fmt.Errorf("config: reading %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse is Load of a file's contents; path names it in errors.
func Parse(path string, data []byte) (Config, error) {
	c := Default()
	if len(bytes.TrimSpace(data)) == 0 {
		return c, nil
	}
	if err := duplicateKey(data); err != nil {
		return c, fmt.Errorf("config: %s: %w", path, err)
	}
	var probe map[string]json.RawMessage
	if yaml.Unmarshal(data, &probe) == nil && nvidiaFormat(slices.Collect(maps.Keys(probe))) {
		return c, fmt.Errorf("config: %s: this is NVIDIA k8s-device-plugin's config format (version: v1, flags: ...); gpu-device-plugin takes its own keys: %s gives each one's counterpart, and gpu-device-plugin migrate --from %s converts it", path, MigrationGuide, path)
	}
	if err := checkNICResources(path, data); err != nil {
		return c, err
	}
	if err := checkSharing(path, data); err != nil {
		return c, err
	}
	// Strict, for duplicate keys and syntax; the values are decoded below.
	var top map[string]json.RawMessage
	if err := yaml.UnmarshalStrict(data, &top); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) || strings.Contains(err.Error(), "cannot unmarshal") {
			return c, fmt.Errorf("config: %s: want a map of keys such as \"deviceIDStrategy: uuid\"", path)
		}
		return c, fmt.Errorf("config: %s: %s", path, fieldError(err))
	}
	known := fileKeys()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(top)) {
		if !slices.Contains(known, key) {
			errs = append(errs, fmt.Errorf("config: %s: %s", path, unknownKey(key, known)))
			continue
		}
		// JSON is YAML: decoding through the YAML package keeps its
		// conversions (metricsAddress: 9400 is the string "9400").
		one, err := json.Marshal(map[string]json.RawMessage{key: top[key]})
		if err == nil {
			err = yaml.UnmarshalStrict(one, &c)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %s: %s", path, key, valueError(err)))
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	// sharing is file-only, so its values are checked here too, naming the
	// file; what depends on migStrategy waits for Validate (flags).
	for _, err := range validateSharing(c, false) {
		errs = append(errs, fmt.Errorf("config: %s: %w", path, err))
	}
	return c, errors.Join(errs...)
}

// valueError rewords a decoding error of one key's value.
func valueError(err error) string {
	msg := fieldError(err)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		te.Field = ""
		return strings.TrimPrefix(typeError("", te).Error(), ": ")
	}
	if i := strings.Index(msg, "json: cannot unmarshal "); i >= 0 {
		// "json: cannot unmarshal number into Go struct field Config.x of type string"
		rest := msg[i+len("json: cannot unmarshal "):]
		if got, want, ok := strings.Cut(rest, " into Go "); ok {
			if j := strings.LastIndex(want, " of type "); j >= 0 {
				want = want[j+len(" of type "):]
			}
			return fmt.Sprintf("got %s, want %s", article(got), want)
		}
	}
	return msg
}

// fieldError rewords the YAML decoder's messages so they lead with the key.
func fieldError(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: while decoding JSON: ")
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: ")
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return fmt.Sprintf("unknown key %s; known keys: %s", rest, strings.Join(fileKeys(), ", "))
	}
	return msg
}
