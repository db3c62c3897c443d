package archive

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

var _ Destination = (*S3)(nil)

// s3CallTimeout bounds one S3 call whose context has no deadline.
const s3CallTimeout = 2 * time.Minute

// s3StallTimeout bounds the wait for the server's answer to one request
// once it was sent (S3Config.StallTimeout): a server that accepts
// connections and answers nothing (hung, overloaded) fails the request,
// which the SDK tries again (3 attempts in all), rather than holding the
// call for s3CallTimeout. S3 answers a request, a PUT of a segment too,
// well within it once the body is sent.
const s3StallTimeout = 20 * time.Second

// s3ConflictRetries is how often PutNew repeats a conditional write the
// server answered with 409 ConditionalRequestConflict (another write of
// the same key was in flight); the repeat then gets 412 or succeeds.
const s3ConflictRetries = 5

// S3Config names an S3 bucket prefix and how to reach it. NewS3 takes it;
// ParseURL fills it from an s3:// URL and the usual AWS variables.
type S3Config struct {
	// Bucket is the bucket's name.
	Bucket string
	// Prefix is the key prefix the archive lives under, without a leading
	// or trailing slash ("" for the bucket's root).
	Prefix string
	// Endpoint is the URL of an S3-compatible server
	// (http://127.0.0.1:7070); empty: AWS S3 of the configured region, or
	// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL.
	Endpoint string
	// Region signs the requests (default: AWS_REGION, else us-east-1).
	Region string
	// AccessKeyID and SecretAccessKey are static credentials; empty: the
	// SDK's default chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a
	// profile, web identity, the instance role).
	AccessKeyID, SecretAccessKey string
	// PathStyle addresses the bucket in the path (http://host/bucket/key)
	// instead of the host name (http://bucket.host/key); most S3-compatible
	// servers need it.
	PathStyle bool
	// StallTimeout is how long a request may wait for the server's answer
	// once sent (the response's headers) before it fails (default
	// s3StallTimeout).
	StallTimeout time.Duration
}

// S3 is a Destination under a prefix of an S3 bucket (AWS S3 or an
// S3-compatible server). A PUT is atomic in S3: a reader sees a whole
// object or none, and an acknowledged PUT is durable as the store makes
// it. PutNew is a conditional PUT (If-None-Match: *), so the server must
// support conditional writes (AWS S3 does since 2024).
type S3 struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
}

// bucketName is what S3 allows as a bucket name (3 to 63 characters).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// NewS3 returns the Destination cfg names. It makes no request: a bucket
// that does not exist or credentials that are refused fail the first call
// with an error matching ErrUnavailable.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if !bucketName.MatchString(cfg.Bucket) {
		return nil, newError(CodeURLInvalid, nil, "bucket name %q", cfg.Bucket)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		if err := checkName(prefix); err != nil {
			return nil, newError(CodeURLInvalid, nil, "key prefix %q", cfg.Prefix)
		}
		prefix += "/"
	}
	var opts []func(*config.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" || cfg.SecretAccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	ac, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, newError(CodeURLInvalid, err, "s3 configuration")
	}
	if ac.Region == "" {
		ac.Region = "us-east-1"
	}
	stall := cfg.StallTimeout
	if stall <= 0 {
		stall = s3StallTimeout
	}
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) { tr.ResponseHeaderTimeout = stall })
	client := s3.NewFromConfig(ac, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.HTTPClient = hc
	})
	return &S3{client: client, bucket: cfg.Bucket, prefix: prefix}, nil
}

// String implements Destination.
func (s *S3) String() string { return "s3://" + s.bucket + "/" + strings.TrimSuffix(s.prefix, "/") }

// key maps an object name to the object's key, refusing names every
// Destination refuses.
func (s *S3) key(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return s.prefix + name, nil
}

// callContext applies s3CallTimeout to a context without a deadline.
func callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s3CallTimeout)
}

// Put implements Destination.
func (s *S3) Put(ctx context.Context, name string, data []byte) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(key),
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	return nil
}

// PutNew implements Destination with a conditional PUT (If-None-Match: *):
// the server writes the object only if the key has none, atomically, and
// answers 412 Precondition Failed otherwise.
func (s *S3) PutNew(ctx context.Context, name string, data []byte) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	for try := 0; ; try++ {
		_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        aws.String(s.bucket),
			Key:           aws.String(key),
			Body:          bytes.NewReader(data),
			ContentLength: aws.Int64(int64(len(data))),
			IfNoneMatch:   aws.String("*"),
		})
		switch code, status := apiError(err); {
		case err == nil:
			return nil
		case status == http.StatusPreconditionFailed || code == "PreconditionFailed":
			return newError(CodeConflict, nil, "%s exists", name)
		case (status == http.StatusConflict || code == "ConditionalRequestConflict") && try < s3ConflictRetries:
			select {
			case <-ctx.Done():
				return newError(CodeUnavailable, ctx.Err(), "put %s", name)
			case <-time.After(time.Duration(try+1) * 20 * time.Millisecond):
			}
			continue
		default:
			return newError(CodeUnavailable, err, "put %s", name)
		}
	}
}

// apiError returns the S3 error code and HTTP status of err ("", 0 when
// err is not an answer of the server).
func apiError(err error) (code string, status int) {
	if err == nil {
		return "", 0
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	return code, status
}

// Get implements Destination.
func (s *S3) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	key, err := s.key(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		if code, status := apiError(err); code == "NoSuchKey" || (status == http.StatusNotFound && code != "NoSuchBucket") {
			return nil, newError(CodeObjectNotFound, nil, "%s", name)
		}
		return nil, newError(CodeUnavailable, err, "get %s", name)
	}
	defer out.Body.Close()
	if n := aws.ToInt64(out.ContentLength); n > limit {
		return nil, tooLarge(name, n, limit)
	}
	b, err := readAtMost(out.Body, limit)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			return nil, newError(CodeCorrupt, err, "get %s", name)
		}
		if checksumFailed(out, int64(len(b))) {
			return nil, newError(CodeCorrupt, err, "get %s: its bytes do not match the checksum the server stored with it", name)
		}
		return nil, newError(CodeUnavailable, err, "get %s", name)
	}
	return b, nil
}

// checksumFailed tells whether a GetObject body that failed after read
// bytes failed the client's check of the object's checksum: the SDK checks
// the bytes against the checksum the server sent with them (stored when
// the object was written) once it has read them all, and fails the last
// read when they differ, with an error of a type it does not export. On a
// response it checks, an error after every byte the server announced
// arrived is that check; an error before is the connection's.
func checksumFailed(out *s3.GetObjectOutput, read int64) bool {
	v, ok := s3.GetChecksumValidationMetadata(out.ResultMetadata)
	return ok && len(v.AlgorithmsUsed) > 0 && out.ContentLength != nil && read == *out.ContentLength
}

// List implements Destination. Keys under the archive's prefix that are
// not object names of an archive (a "folder" marker ending in "/") are not
// listed.
func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	ctx, cancel := callContext(ctx)
	defer cancel()
	var names []string
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix + prefix),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, newError(CodeUnavailable, err, "list %s", prefix)
		}
		for _, o := range page.Contents {
			name, ok := strings.CutPrefix(aws.ToString(o.Key), s.prefix)
			if ok && checkName(name) == nil {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}
