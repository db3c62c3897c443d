// Package pgtest gives tests a PostgreSQL database: a cluster that the
// repo's own script starts (deploy/local/postgres.sh, Debian's PostgreSQL,
// installed if missing) when SIDECAR_TEST_POSTGRES=1, or the server at
// SIDECAR_TEST_POSTGRES_URL; without either, the tests that need one skip.
// Each URL call creates a database of its own, dropped when the test ends.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/proctest"
)

// Environment variables.
const (
	EnvStart = "SIDECAR_TEST_POSTGRES"
	EnvURL   = "SIDECAR_TEST_POSTGRES_URL"
)

var (
	once     sync.Once
	adminURL string
	startErr error
	stateDir string
	port     int
	counter  atomic.Int64
)

// URL returns the URL of a new, empty database; the test skips when no
// PostgreSQL is configured.
func URL(tb testing.TB) string {
	tb.Helper()
	if os.Getenv(EnvURL) == "" && os.Getenv(EnvStart) != "1" {
		tb.Skip("set " + EnvStart + "=1 (the repo starts a PostgreSQL cluster) or " + EnvURL + " to run the PostgreSQL tests")
	}
	once.Do(start)
	if startErr != nil {
		tb.Fatal(startErr)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), counter.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	})
	return withDatabase(adminURL, name)
}

// Main runs the tests of a package and stops the cluster it started.
func Main(m *testing.M) {
	code := m.Run()
	if stateDir != "" {
		_ = script(stateDir, port, "stop").Run()
		_ = os.RemoveAll(filepath.Dir(stateDir))
	}
	os.Exit(code)
}

func start() {
	if u := os.Getenv(EnvURL); u != "" {
		adminURL = u
		return
	}
	dir, err := os.MkdirTemp("", "sidecar-pgtest-")
	if err != nil {
		startErr = err
		return
	}
	// The cluster's owner (postgres, when the tests run as root) enters it.
	if err := os.Chmod(dir, 0o755); err != nil {
		startErr = err
		return
	}
	if port, err = freePort(); err != nil {
		startErr = err
		return
	}
	stateDir = filepath.Join(dir, "pg")
	cmd := script(stateDir, port, "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		startErr = fmt.Errorf("deploy/local/postgres.sh start: %v\n%s", err, out)
		return
	}
	adminURL = fmt.Sprintf("postgres://sidecar@127.0.0.1:%d/sidecar?sslmode=disable", port)
}

func script(stateDir string, port int, command string) *exec.Cmd {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	cmd := exec.Command(filepath.Join(root, "deploy", "local", "postgres.sh"), command)
	cmd.Env = append(os.Environ(), "PG_STATE_DIR="+stateDir, fmt.Sprintf("PG_PORT=%d", port), "PG_DATABASE=sidecar")
	return cmd
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Cluster is a PostgreSQL cluster of one test's own, which it may stop and
// start (a database restart under a running sidecar).
type Cluster struct {
	// URL is its database's URL.
	URL  string
	dir  string
	port int
}

// Own starts a cluster for tb alone (deploy/local/postgres.sh, its own
// directory and port), stopped when the test ends; it skips like URL.
func Own(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Getenv(EnvStart) != "1" {
		tb.Skip("set " + EnvStart + "=1: the test starts and stops a PostgreSQL cluster of its own")
	}
	dir, err := os.MkdirTemp("", "sidecar-pgtest-own-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	p, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{dir: filepath.Join(dir, "pg"), port: p,
		URL: fmt.Sprintf("postgres://sidecar@127.0.0.1:%d/sidecar?sslmode=disable", p)}
	tb.Cleanup(func() {
		_ = script(c.dir, c.port, "stop").Run()
		_ = os.RemoveAll(dir)
	})
	c.Start(tb)
	return c
}

// Start starts the cluster (again).
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	if out, err := script(c.dir, c.port, "start").CombinedOutput(); err != nil {
		tb.Fatalf("deploy/local/postgres.sh start: %v\n%s", err, out)
	}
}

// Stop stops it (pg_ctl stop -m fast: sessions are cut, nothing committed is lost).
func (c *Cluster) Stop(tb testing.TB) {
	tb.Helper()
	if out, err := script(c.dir, c.port, "stop").CombinedOutput(); err != nil {
		tb.Fatalf("deploy/local/postgres.sh stop: %v\n%s", err, out)
	}
}

// Freeze stops every process of the cluster (SIGSTOP of the postmaster
// and its backends): a hung host or a partition, whose connections stay
// open and whose kernel still accepts new ones, while nothing answers.
// The returned thaw (also run when the test ends) lets it go on.
func (c *Cluster) Freeze(tb testing.TB) (thaw func()) {
	tb.Helper()
	pids, err := c.processes()
	if err != nil {
		tb.Fatal(err)
	}
	// The thaw runs before the cluster's stop, which Own registered first.
	return proctest.Freeze(tb, pids...)
}

// processes returns the postmaster's pid (its data directory's
// postmaster.pid) and those of its children.
func (c *Cluster) processes() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat)[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Roles is a database set up as docs/postgres.md says: its owner (that
// `sidecar migrate` connects as), its runtime role (that `sidecar serve`
// connects as) and its retention role (that retention removes runs as),
// made by deploy/postgres/roles.sql.
type Roles struct {
	Owner, Runtime, Retention, Database string
	// OwnerURL, RuntimeURL and RetentionURL connect to Database as each
	// role.
	OwnerURL, RuntimeURL, RetentionURL string
}

// NewRoles runs deploy/postgres/roles.sql with psql, as the cluster's
// superuser, with role and database names of the test's own; the database
// and the roles are dropped when the test ends. It skips like URL.
func NewRoles(tb testing.TB) Roles {
	tb.Helper()
	URL(tb) // skips, or starts the cluster
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		tb.Fatal(err)
	}
	n := counter.Add(1)
	r := Roles{
		Owner:     fmt.Sprintf("o_%d_%d", os.Getpid(), n),
		Runtime:   fmt.Sprintf("r_%d_%d", os.Getpid(), n),
		Retention: fmt.Sprintf("d_%d_%d", os.Getpid(), n),
		Database:  fmt.Sprintf("t_%d_%d", os.Getpid(), n),
	}
	_, file, _, _ := runtime.Caller(0)
	sql := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "postgres", "roles.sql")
	cmd := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "owner="+r.Owner, "-v", "runtime="+r.Runtime, "-v", "retention="+r.Retention,
		"-v", "database="+r.Database, "-f", sql,
		"-h", cfg.Host, "-p", fmt.Sprint(cfg.Port), "-U", cfg.User, "-d", cfg.Database)
	tb.Cleanup(func() {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+r.Database+" WITH (FORCE)")
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+r.Owner)
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+r.Runtime)
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+r.Retention)
	})
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("psql -f deploy/postgres/roles.sql: %v\n%s", err, out)
	}
	base := withDatabase(adminURL, r.Database)
	r.OwnerURL = withUser(base, r.Owner)
	r.RuntimeURL = withUser(base, r.Runtime)
	r.RetentionURL = withUser(base, r.Retention)
	return r
}

// withUser replaces the user of a postgres:// URL (one without a password).
func withUser(url, user string) string {
	scheme, rest, _ := strings.Cut(url, "://")
	if _, host, ok := strings.Cut(rest, "@"); ok {
		rest = host
	}
	return scheme + "://" + user + "@" + rest
}

// withDatabase replaces the database of a postgres:// URL.
func withDatabase(url, db string) string {
	head, query, _ := strings.Cut(url, "?")
	i := strings.LastIndexByte(head, '/')
	out := head[:i+1] + db
	if query != "" {
		out += "?" + query
	}
	return out
}
