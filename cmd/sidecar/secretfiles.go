package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// checkSecretFile refuses a credential or token file others could read or
// change, as ssh refuses a private key: the file (after symlinks) must be
// owned by this user or root, give nothing to others, and give its group
// at most read access, and only when the group is this process's own
// (a Kubernetes Secret mounted with fsGroup and defaultMode 0440). A file
// that cannot be stat'ed is left to the code that reads it. what names the
// file's flag or variable, e.g. "--nats-password-file".
func checkSecretFile(what, path string) string {
	if path == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	perm := fi.Mode().Perm()
	fix := fmt.Sprintf("chmod 600 %s (and chown it to the sidecar's user)", path)
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case perm&0o007 != 0:
		return fmt.Sprintf("%s %s is mode %04o: other users can read or change it; %s", what, path, perm, fix)
	case perm&0o070 != 0 && (perm&0o070 != 0o040 || !ok || int(st.Gid) != os.Getegid()):
		return fmt.Sprintf("%s %s is mode %04o: its group (not only the sidecar's own) can read or change it; %s", what, path, perm, fix)
	case ok && st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Sprintf("%s %s is owned by uid %d, who can change it; chown it to the sidecar's user and %s", what, path, st.Uid, fix)
	}
	return ""
}

// secretFileProblems checks every credential and token file serve reads.
func (c *Config) secretFileProblems() []string {
	files := []struct{ what, path string }{
		{"--nats-password-file", c.NATS.PasswordFile},
		{"--nats-creds", c.NATS.Creds},
		{"--nats-nkey", c.NATS.NKey},
		{"--nats-key", c.NATS.Key},
		{"--tls-key", c.API.TLSKey},
		{"--tokens-file", c.API.TokensFile},
		{"--conductor-notify-secret-file", c.API.NotifySecretFile},
		{"--retention-nats-password-file", c.Retention.PasswordFile},
		{"--archive-key-file", c.Retention.KeyFile},
	}
	for _, s := range c.Bus.Sinks {
		if f := s.Params["secret-file"]; f != "" {
			files = append(files, struct{ what, path string }{"--bus-sink " + s.name() + " secret-file", f})
		}
	}
	if c.postgresStore() {
		// libpq's password file: PGPASSFILE, else ~/.pgpass.
		if f := os.Getenv("PGPASSFILE"); f != "" {
			files = append(files, struct{ what, path string }{"PGPASSFILE", f})
		} else if home, err := os.UserHomeDir(); err == nil {
			files = append(files, struct{ what, path string }{"the PostgreSQL password file", filepath.Join(home, ".pgpass")})
		}
	}
	var p []string
	for _, f := range files {
		if msg := checkSecretFile(f.what, f.path); msg != "" {
			p = append(p, msg)
		}
	}
	return p
}
