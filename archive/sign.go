package archive

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// MinKeyBytes is the shortest manifest key Keys accepts: 32 bytes, the
// size of the HMAC-SHA256 it keys.
const MinKeyBytes = 32

// Signature is a manifest's HMAC-SHA256 under a key of the sidecar's:
// proof that a holder of that key wrote the manifest, which its Chain
// alone cannot give (anyone who can write to the archive can chain a
// well-formed manifest onto its head).
type Signature struct {
	// KeyID names the key: the first 16 hex digits of the SHA-256 of
	// "conductor-sidecar archive key\n" and the key.
	KeyID string `json:"keyId"`
	// MAC is the lowercase hex HMAC-SHA256, under the key, of
	// "conductor-sidecar archive manifest\n" and the manifest's Chain. The
	// Chain is the hash of everything else in the manifest (Prev included),
	// so the MAC covers the whole manifest and every one before it.
	MAC string `json:"mac"`
}

// Keys are the keys manifests are signed and checked with: the first signs
// what is written, every one checks (a key rotated out stays in the list
// as long as manifests signed with it are kept).
type Keys struct {
	keys []key
}

type key struct {
	id     string
	secret []byte
}

// ParseKeys reads keys from a key file's content: one key a line, the
// first the signing one; blank lines and lines starting with # are
// skipped, and each line's surrounding white space is not part of its
// key. A key shorter than MinKeyBytes, the same key twice, or no key at
// all is ErrInputInvalid.
func ParseKeys(data []byte) (*Keys, error) {
	ks := &Keys{}
	seen := map[string]int{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < MinKeyBytes {
			return nil, newError(CodeInputInvalid, nil, "key on line %d has %d bytes, want at least %d (e.g. openssl rand -hex 32)", n+1, len(line), MinKeyBytes)
		}
		k := key{id: keyID([]byte(line)), secret: []byte(line)}
		if first, dup := seen[k.id]; dup {
			return nil, newError(CodeInputInvalid, nil, "key on line %d is the key on line %d again", n+1, first)
		}
		seen[k.id] = n + 1
		ks.keys = append(ks.keys, k)
	}
	if len(ks.keys) == 0 {
		return nil, newError(CodeInputInvalid, nil, "no key (one a line, at least %d bytes each)", MinKeyBytes)
	}
	return ks, nil
}

// LoadKeys reads a key file (ParseKeys).
func LoadKeys(path string) (*Keys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, newError(CodeInputInvalid, err, "key file")
	}
	ks, err := ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ks, nil
}

// SigningKeyID is the id of the key that signs (the file's first).
func (ks *Keys) SigningKeyID() string { return ks.keys[0].id }

// IDs are the ids of every key, the signing one first.
func (ks *Keys) IDs() []string {
	ids := make([]string, len(ks.keys))
	for i, k := range ks.keys {
		ids[i] = k.id
	}
	return ids
}

func keyID(secret []byte) string {
	s := sha256.Sum256(append([]byte("conductor-sidecar archive key\n"), secret...))
	return hex.EncodeToString(s[:8])
}

func mac(secret []byte, chain string) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("conductor-sidecar archive manifest\n"))
	h.Write([]byte(chain))
	return h.Sum(nil)
}

// sign returns the signature of a manifest whose Chain is chain.
func (ks *Keys) sign(chain string) *Signature {
	k := ks.keys[0]
	return &Signature{KeyID: k.id, MAC: hex.EncodeToString(mac(k.secret, chain))}
}

// check returns nil when m's signature is right under one of the keys;
// an unsigned manifest, or one signed with another key or whose MAC does
// not match, is ErrCorrupt.
func (ks *Keys) check(m *Manifest) error {
	if m.Signature == nil {
		return newError(CodeCorrupt, nil, "manifest %d is not signed", m.Seq)
	}
	for _, k := range ks.keys {
		if k.id != m.Signature.KeyID {
			continue
		}
		got, err := hex.DecodeString(m.Signature.MAC)
		if err != nil || !hmac.Equal(got, mac(k.secret, m.Chain)) {
			return newError(CodeCorrupt, nil, "manifest %d: its signature is not its content's under key %s", m.Seq, k.id)
		}
		return nil
	}
	return newError(CodeCorrupt, nil, "manifest %d is signed with key %s, which is not one of the keys given (%s)", m.Seq, m.Signature.KeyID, strings.Join(ks.IDs(), ", "))
}

// signatureField is the stored form of s as the manifest's last field.
func signatureField(s *Signature) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `,"signature":{"keyId":%q,"mac":%q}`, s.KeyID, s.MAC)
	return b.Bytes()
}
