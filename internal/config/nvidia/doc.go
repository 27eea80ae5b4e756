// Package nvidia reads NVIDIA k8s-device-plugin's settings (its
// `version: v1` config file and its environment variables) and says what
// each one is here: Keys is the one table, and the migrate command, the
// warning about NVIDIA's variables at start and the migration guide's
// table are all made from it. It never applies NVIDIA's settings itself.
package nvidia
