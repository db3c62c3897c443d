package main

import "os"

// envOr returns the environment variable name, or def when it is unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}
