package natsstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestKeyPurger_PurgeKeys: the named keys leave with their delete markers
// and nothing else does; a key that could be a wildcard (from a runId
// such as ">" or "a.*") purges nothing; a missing bucket or key is no
// error. It runs as the retention user, allowed to purge the bucket.
func TestKeyPurger_PurgeKeys(t *testing.T) {
	ctx := context.Background()
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, "PURGE_TEST", "NO_SUCH_BUCKET")})
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "PURGE_TEST"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"drain.a", "drain.b", "resume.a", "resume.b"} {
		if _, err := kv.Put(ctx, k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "resume.a"); err != nil { // a marker stays
		t.Fatal(err)
	}
	nc, err := srv.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := natsstore.NewKeyPurger(rjs)
	for _, keys := range [][]string{{"drain.>"}, {">"}, {"drain.*"}, {"drain..a"}, {""}, {"drain.a b"}} {
		if err := p.PurgeKeys(ctx, "PURGE_TEST", keys...); err != nil {
			t.Fatalf("PurgeKeys(%q): %v", keys, err)
		}
	}
	if got := subjects(t, js, "PURGE_TEST"); len(got) != 4 {
		t.Fatalf("after wildcard-like keys: %v, want the 4 subjects kept", got)
	}
	if err := p.PurgeKeys(ctx, "PURGE_TEST", "drain.a", "resume.a", "never.was"); err != nil {
		t.Fatal(err)
	}
	if got, want := subjects(t, js, "PURGE_TEST"), []string{"$KV.PURGE_TEST.drain.b", "$KV.PURGE_TEST.resume.b"}; !slices.Equal(got, want) {
		t.Fatalf("subjects after the purge: %v, want %v", got, want)
	}
	if err := p.PurgeKeys(ctx, "NO_SUCH_BUCKET", "a"); err != nil {
		t.Fatalf("purge of a missing bucket: %v, want nil", err)
	}
}

// subjects lists the subjects bucket's stream holds messages on, sorted.
func subjects(t *testing.T, js jetstream.JetStream, bucket string) []string {
	t.Helper()
	st, err := js.Stream(context.Background(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter("$KV."+bucket+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for s := range info.State.Subjects {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
