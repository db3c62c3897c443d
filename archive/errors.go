package archive

import (
	"fmt"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// Machine codes of the package's errors.
const (
	// CodeURLInvalid: an --archive URL the package cannot use (unknown
	// scheme, a relative path, a host on file://).
	CodeURLInvalid = "ARCHIVE_URL_INVALID"
	// CodeInputInvalid: runs handed to Write that cannot be archived as
	// they are (no records, a record of another run, runSeq not strictly
	// increasing, the same run twice); nothing was written.
	CodeInputInvalid = "ARCHIVE_INPUT_INVALID"
	// CodeUnavailable: the destination did not answer or refused a read or
	// write; nothing that was not confirmed may be taken as archived.
	CodeUnavailable = "ARCHIVE_UNAVAILABLE"
	// CodeConflict: another writer took the manifest sequence this writer
	// meant to write; the writer reloads the archive's head and writes again.
	CodeConflict = "ARCHIVE_CONFLICT"
	// CodeCorrupt: what the archive holds does not match what its manifests
	// say (a segment's hash or size, a run's record count or SHA-256, the
	// hash chain over the manifests, an object that does not parse).
	CodeCorrupt = "ARCHIVE_CORRUPT"
	// CodeRunNotFound: no manifest of the archive lists the run.
	CodeRunNotFound = "ARCHIVE_RUN_NOT_FOUND"
	// CodeObjectNotFound: the destination has no object of that name.
	CodeObjectNotFound = "ARCHIVE_OBJECT_NOT_FOUND"
)

// kinds are the kinds of the package's codes.
var kinds = map[string]errcode.Kind{
	CodeURLInvalid:     errcode.Invalid,
	CodeInputInvalid:   errcode.Invalid,
	CodeUnavailable:    errcode.Unavailable,
	CodeConflict:       errcode.Conflict,
	CodeCorrupt:        errcode.Internal,
	CodeRunNotFound:    errcode.NotFound,
	CodeObjectNotFound: errcode.NotFound,
}

// Error is an error of the archive with a machine code. Errors with the
// same code match with errors.Is, and so does the code's kind
// (errors.Is(err, errcode.NotFound)).
type Error struct {
	Code    string
	Message string
	// Err is the cause, if any.
	Err error
}

func (e *Error) Error() string {
	msg := "archive: " + e.Code
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// Is matches errors of the same code, and the code's kind.
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Errors of the package, matched with errors.Is.
var (
	// ErrURLInvalid: see CodeURLInvalid.
	ErrURLInvalid = &Error{Code: CodeURLInvalid}
	// ErrInputInvalid: see CodeInputInvalid.
	ErrInputInvalid = &Error{Code: CodeInputInvalid}
	// ErrUnavailable: see CodeUnavailable.
	ErrUnavailable = &Error{Code: CodeUnavailable}
	// ErrConflict: see CodeConflict.
	ErrConflict = &Error{Code: CodeConflict}
	// ErrCorrupt: see CodeCorrupt.
	ErrCorrupt = &Error{Code: CodeCorrupt}
	// ErrRunNotFound: see CodeRunNotFound.
	ErrRunNotFound = &Error{Code: CodeRunNotFound}
	// ErrObjectNotFound: see CodeObjectNotFound.
	ErrObjectNotFound = &Error{Code: CodeObjectNotFound}
)

// newError returns an *Error with code and a formatted message.
func newError(code string, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: cause}
}

// Codes of the problems Verify reports (Problem.Code). They name what is
// wrong with an archive; Verify's own error is only for a destination it
// cannot read.
const (
	// ProblemArchiveEmpty: the destination holds no manifest at all: a
	// wrong location (directory, bucket prefix), an archive nothing was
	// written to yet, or one whose manifests were all removed. Nothing was
	// verified. VerifyOptions.AllowEmpty accepts it.
	ProblemArchiveEmpty = "ARCHIVE_EMPTY"
	// ProblemManifestMissing: a manifest seq between 1 and the newest is absent.
	ProblemManifestMissing = "ARCHIVE_MANIFEST_MISSING"
	// ProblemManifestInvalid: a manifest does not parse, or its Chain is
	// not the hash of its content.
	ProblemManifestInvalid = "ARCHIVE_MANIFEST_INVALID"
	// ProblemChainBroken: a manifest's Prev is not its predecessor's Chain.
	ProblemChainBroken = "ARCHIVE_CHAIN_BROKEN"
	// ProblemSegmentMissing: a manifest names a segment that is absent.
	ProblemSegmentMissing = "ARCHIVE_SEGMENT_MISSING"
	// ProblemSegmentCorrupt: a segment does not match its manifest (size,
	// SHA-256, a run's record count or SHA-256, a record that does not
	// parse or is out of order).
	ProblemSegmentCorrupt = "ARCHIVE_SEGMENT_CORRUPT"
	// ProblemHeadMismatch: VerifyOptions.ExpectHead is the Chain of no
	// manifest of the archive: manifests it committed to were removed or
	// rewritten.
	ProblemHeadMismatch = "ARCHIVE_HEAD_MISMATCH"
	// ProblemCatalogInvalid: an object under catalog/ is not what the
	// manifests it covers give (a name no range has, a shard that does not
	// parse, or entries that differ): a lookup may not find a run that
	// shard should name. Removing the object makes lookups read the ranges
	// below it, or its manifests, instead.
	ProblemCatalogInvalid = "ARCHIVE_CATALOG_INVALID"
	// ProblemRunCopiesDisagree: a run archived more than once whose later
	// copy names another tenant, project, environment, plan or plan
	// version than its first: the sidecar archives a run again only with
	// the records that came after its first copy, which carry the run's
	// own names, so such a copy was not written by it.
	ProblemRunCopiesDisagree = "ARCHIVE_RUN_COPIES_DISAGREE"
	// ProblemManifestUnsigned (with VerifyOptions.Keys): a manifest after
	// the first signed one carries no signature, or no manifest is signed
	// at all: it was added or rewritten by someone without the keys.
	ProblemManifestUnsigned = "ARCHIVE_MANIFEST_UNSIGNED"
	// ProblemSignatureInvalid (with VerifyOptions.Keys): a manifest's
	// signature is not its content's under the key it names, or names a
	// key not given.
	ProblemSignatureInvalid = "ARCHIVE_SIGNATURE_INVALID"
)
