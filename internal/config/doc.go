// Package config holds the plugin's settings: their defaults, the YAML
// config file, the flag and environment-variable names that override it,
// and the checks that turn a bad value into an error naming the field and
// what it accepts.
package config
