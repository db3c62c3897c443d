package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// exitArchiveUnreadable is the exit code of "archive verify" when the
// archive could not be read (ARCHIVE_UNAVAILABLE: the destination down,
// credentials refused, a directory that does not exist): nothing was
// verified, either way. An archive read that does not verify exits 1.
const exitArchiveUnreadable = 3

// errArchiveUnreadable makes Main.Run exit with exitArchiveUnreadable.
type errArchiveUnreadable struct{ err error }

func (e errArchiveUnreadable) Error() string {
	return e.err.Error() + "; nothing was verified"
}

func (e errArchiveUnreadable) Unwrap() error { return e.err }

// archiveVerifyExit is the end of "archive verify -h".
const archiveVerifyExit = `
Exit status:
  0  the archive verifies
  1  it does not: PROBLEM lines (ARCHIVE_EMPTY: no manifest at the location)
  2  usage
  3  the archive could not be read (ARCHIVE_UNAVAILABLE): nothing was verified
`

// ArchiveCommand reads a run archive directly, without a running sidecar
// (docs/retention.md): "sidecar archive verify" proves it complete and
// unchanged, "sidecar archive events RUN_ID" prints an archived run's log.
type ArchiveCommand struct{ m *Main }

const archiveSynopsis = "archive verify --archive URL [--archive-key-file FILE] [--expect-head CHAIN] [--allow-empty] [-o json] | archive events --archive URL [--archive-key-file FILE] RUN_ID [--vocabulary core|noetl] [-o json]"

// Run implements "sidecar archive".
func (c *ArchiveCommand) Run(ctx context.Context, args []string) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "verify":
		return c.verify(ctx, args)
	case "events":
		return c.events(ctx, args)
	}
	fs := c.m.newFlagSet("archive", archiveSynopsis)
	if sub == "-h" || sub == "--help" || sub == "help" {
		fs.Usage()
		return flag.ErrHelp
	}
	if sub == "" {
		return usageError(fs, "say verify or events")
	}
	return usageError(fs, "unknown subcommand %q: say verify or events", sub)
}

// archiveFlags are the flags every archive subcommand takes.
type archiveFlags struct {
	url     *string
	keyFile *string
	output  *string
}

func (f *archiveFlags) register(fs *flag.FlagSet) {
	f.url = fs.String("archive", envOr("SIDECAR_ARCHIVE", ""), "the archive: file:///dir or s3://bucket/prefix (env SIDECAR_ARCHIVE; S3 endpoint and credentials from the AWS variables, docs/retention.md)")
	f.keyFile = fs.String("archive-key-file", envOr("SIDECAR_ARCHIVE_KEY_FILE", ""), "the keys serve signs manifests with (its --archive-key-file): every manifest from the first signed one on must be signed by one of them (env SIDECAR_ARCHIVE_KEY_FILE)")
	f.output = fs.String("o", "text", "output format: text or json")
}

// keys loads --archive-key-file (nil without one).
func (f *archiveFlags) keys(fs *flag.FlagSet) (*archive.Keys, error) {
	if *f.keyFile == "" {
		return nil, nil
	}
	if msg := checkSecretFile("--archive-key-file", *f.keyFile); msg != "" {
		return nil, usageError(fs, "%s", msg)
	}
	ks, err := archive.LoadKeys(*f.keyFile)
	if err != nil {
		return nil, usageError(fs, "--archive-key-file: %v", err)
	}
	return ks, nil
}

// parse parses args (flags and positional arguments in any order) and
// returns the positional ones.
func (f *archiveFlags) parse(fs *flag.FlagSet, args []string) ([]string, archive.Destination, error) {
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, errUsage // flag printed it
		}
		if fs.NArg() == 0 {
			break
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if *f.output != "text" && *f.output != "json" {
		return nil, nil, usageError(fs, "-o must be text or json")
	}
	if *f.url == "" {
		return nil, nil, usageError(fs, "--archive is required (file:///dir or s3://bucket/prefix)")
	}
	dest, err := archive.ParseURL(*f.url)
	if err != nil {
		return nil, nil, usageError(fs, "%v", err)
	}
	return pos, dest, nil
}

func (c *ArchiveCommand) verify(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("archive verify", "archive verify --archive URL [--archive-key-file FILE] [--expect-head CHAIN] [--allow-empty] [-o json]")
	var af archiveFlags
	af.register(fs)
	head := fs.String("expect-head", "", "a chain hash reported earlier (the archive's head then): the archive must still hold that manifest, so nothing up to it was dropped or rewritten")
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		if c.m.help {
			fmt.Fprint(fs.Output(), archiveVerifyExit)
		}
	}
	allowEmpty := fs.Bool("allow-empty", false, "accept a location that holds no manifest (an archive nothing was written to yet); without it that is ARCHIVE_EMPTY")
	pos, dest, err := af.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(fs, "unexpected argument %q", pos[0])
	}
	keys, err := af.keys(fs)
	if err != nil {
		return err
	}
	rep, err := archive.Verify(ctx, dest, archive.VerifyOptions{ExpectHead: *head, AllowEmpty: *allowEmpty, Keys: keys})
	if err != nil {
		return errArchiveUnreadable{err}
	}
	if *af.output == "json" {
		if err := printJSON(c.m.Stdout, rep); err != nil {
			return err
		}
	} else {
		for _, p := range rep.Problems {
			at := ""
			if p.Object != "" {
				at = " " + p.Object
			}
			fmt.Fprintf(c.m.Stdout, "PROBLEM %s%s: %s\n", p.Code, escapeText(at), escapeText(p.Message))
		}
		for _, o := range rep.Orphans {
			fmt.Fprintf(c.m.Stdout, "orphan %s (no manifest names it: a write that did not finish; not part of the archive)\n", escapeText(o))
		}
		fmt.Fprintf(c.m.Stdout, "verified %s: %s, %s, %s, %s: %s\nhead %s\n",
			escapeText(rep.Destination), countOf(rep.Manifests, "manifest"), countOf(rep.Segments, "segment"), countOf(rep.Runs, "run"),
			countOf(rep.Records, "record"), countOf(len(rep.Problems), "problem"), optional(rep.Head, "(empty archive)"))
		fmt.Fprintf(c.m.Stdout, "catalog: %s match their manifests, %d missing (lookups read the manifests they would cover)\n", countOf(rep.CatalogShards, "shard"), rep.CatalogMissing)
		switch {
		case keys == nil:
			fmt.Fprintln(c.m.Stdout, "signatures: not checked (no --archive-key-file)")
		case rep.FirstSigned > 1:
			fmt.Fprintf(c.m.Stdout, "signatures: %s signed from manifest %d on (1 to %d were written before the archive had keys)\n", countOf(rep.Signed, "manifest"), rep.FirstSigned, rep.FirstSigned-1)
		default:
			fmt.Fprintf(c.m.Stdout, "signatures: %s signed\n", countOf(rep.Signed, "manifest"))
		}
	}
	if len(rep.Problems) == 1 && rep.Problems[0].Code == archive.ProblemArchiveEmpty {
		return fmt.Errorf("%s: no manifest in %s, nothing was verified: check --archive (directory, bucket, prefix), or pass --allow-empty for an archive nothing was written to yet",
			archive.ProblemArchiveEmpty, rep.Destination)
	}
	if len(rep.Problems) > 0 {
		return fmt.Errorf("%d problems: the archive was changed or lost objects after it was written; see docs/retention.md, \"Verifying an archive\"", len(rep.Problems))
	}
	return nil
}

func (c *ArchiveCommand) events(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("archive events", "archive events --archive URL [--archive-key-file FILE] RUN_ID [--vocabulary core|noetl] [-o json]")
	var af archiveFlags
	af.register(fs)
	vocabulary := fs.String("vocabulary", "", "print the log as Core Events Specification v1.0 events (core) or NoETL Runtime Event Model v10 events (noetl), one JSON object per line")
	pos, dest, err := af.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "give one RUN_ID")
	}
	if *vocabulary != "" && *vocabulary != vocab.Core && *vocabulary != vocab.NoETL {
		return usageError(fs, "--vocabulary must be %s or %s", vocab.Core, vocab.NoETL)
	}
	keys, err := af.keys(fs)
	if err != nil {
		return err
	}
	a, err := archive.Open(ctx, dest, archive.Options{Keys: keys})
	if err != nil {
		return err
	}
	defer a.Close(ctx)
	recs, err := a.Records(ctx, pos[0])
	if err != nil {
		return err
	}
	if *vocabulary != "" {
		events, err := vocab.Translate(*vocabulary, recs)
		if err != nil {
			return err
		}
		for _, e := range events {
			if err := printJSONLine(c.m.Stdout, e); err != nil {
				return err
			}
		}
		return nil
	}
	ev := &EventsCommand{c.m}
	for i := range recs {
		if err := ev.print(*af.output, &recs[i]); err != nil {
			return err
		}
	}
	return nil
}
