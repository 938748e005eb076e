// verify checks a thinkgate evidence bundle with Go's golang.org/x/mod/sumdb/note and
// sumdb/tlog and the standard library only: no thinkgate code, no network, no database.
//
// In the bundle's directory (the current one, or the argument) it checks:
//
//   - checkpoint.note carries a valid signature by the log's key in log.vkey (note.Open), and
//     its first line, the log's origin, is that key's name (C2SP tlog-checkpoint);
//   - checkpoint.body and checkpoint.sig, where present, are exactly the text the log signed
//     and the log's signature of it: the bytes the RFC 3161 token stamps and that openssl checks;
//   - records.jsonl: its first line is that same checkpoint; for every record, the leaf hash
//     is recomputed from the record's own bytes (RFC 9162 §2.1.1: SHA-256(0x00 || leaf), the leaf
//     being len(header) as 4 bytes big-endian || header || ciphertext, tlog.RecordHash) and its
//     inclusion proof is checked against the checkpoint's root (tlog.CheckRecord);
//   - every witnesses/*.vkey (C2SP tlog-cosignature, Ed25519 cosignature/v1): a cosignature by
//     that key, if the note has one, must verify over the checkpoint; at least -quorum must.
//
// Exit status 0 and a last line starting "OK:" when everything holds; 1 and a line naming the
// first thing that fails otherwise.
//
// Usage: go run . [-quorum N] [bundle directory]
package main

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type checkpoint struct {
	origin string
	size   int64
	root   tlog.Hash
}

func main() {
	quorum := flag.Int("quorum", 0, "valid witness cosignatures required")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	summary, err := verify(dir, *quorum)
	if err != nil {
		fmt.Fprintln(os.Stderr, "evidence verification FAILED:", err)
		os.Exit(1)
	}
	fmt.Println(summary)
}

func verify(dir string, quorum int) (string, error) {
	vkey, err := os.ReadFile(filepath.Join(dir, "log.vkey"))
	if err != nil {
		return "", err
	}
	verifier, err := note.NewVerifier(strings.TrimSpace(string(vkey)))
	if err != nil {
		return "", fmt.Errorf("log.vkey: %v", err)
	}
	msg, err := os.ReadFile(filepath.Join(dir, "checkpoint.note"))
	if err != nil {
		return "", err
	}
	n, err := note.Open(msg, note.VerifierList(verifier))
	if err != nil {
		return "", fmt.Errorf("checkpoint.note: the log's signature does not verify with log.vkey: %v", err)
	}
	head, err := parseCheckpoint(n.Text)
	if err != nil {
		return "", fmt.Errorf("checkpoint.note: %v", err)
	}
	if head.origin != verifier.Name() {
		return "", fmt.Errorf("checkpoint.note is of the log %q, and log.vkey is %q's key", head.origin, verifier.Name())
	}
	if err := sameAs(dir, "checkpoint.body", []byte(n.Text)); err != nil {
		return "", err
	}
	signature, err := base64.StdEncoding.DecodeString(n.Sigs[0].Base64)
	if err != nil || len(signature) != 4+ed25519.SignatureSize {
		return "", errors.New("checkpoint.note: the log's signature line is malformed")
	}
	if err := sameAs(dir, "checkpoint.sig", signature[4:]); err != nil {
		return "", err
	}
	records, err := checkRecords(filepath.Join(dir, "records.jsonl"), msg, head)
	if err != nil {
		return "", err
	}
	cosigned, err := checkWitnesses(dir, n, quorum)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("OK: %d records included in the checkpoint of %s at size %d, signed by log.vkey; %d witness cosignatures verified",
		records, head.origin, head.size, cosigned), nil
}

// parseCheckpoint reads the body of a C2SP tlog-checkpoint: origin, size, base64 root hash.
func parseCheckpoint(text string) (checkpoint, error) {
	lines := strings.Split(text, "\n")
	if len(lines) < 4 || lines[len(lines)-1] != "" {
		return checkpoint{}, errors.New("not a checkpoint (origin, size and root lines)")
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		return checkpoint{}, fmt.Errorf("malformed tree size %q", lines[1])
	}
	root, err := tlog.ParseHash(lines[2])
	if err != nil {
		return checkpoint{}, fmt.Errorf("malformed root hash %q", lines[2])
	}
	return checkpoint{lines[0], size, root}, nil
}

// sameAs checks that the bundle's file name, if there is one, holds exactly want.
func sameAs(dir, name string, want []byte) error {
	got, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s differs from what checkpoint.note signs", name)
	}
	return nil
}

type record struct {
	Index      *int64   `json:"index"`
	Header     []byte   `json:"header"` // encoding/json reads standard base64 into []byte
	Ciphertext []byte   `json:"ciphertext"`
	LeafHash   []byte   `json:"leaf_hash"`
	Hashes     [][]byte `json:"hashes"`
}

func checkRecords(path string, signed []byte, head checkpoint) (int, error) {
	file, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	reader := bufio.NewReader(file)
	first, err := reader.ReadBytes('\n')
	var top struct {
		Checkpoint string `json:"checkpoint"`
	}
	if err != nil || json.Unmarshal(first, &top) != nil || top.Checkpoint != string(signed) {
		return 0, errors.New("records.jsonl line 1: not the checkpoint in checkpoint.note")
	}
	count := 0
	for number := 2; ; number++ {
		line, err := reader.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if problem := checkRecord(line, head); problem != nil {
				return count, fmt.Errorf("records.jsonl line %d: %v", number, problem)
			}
			count++
		}
		if err == io.EOF {
			return count, nil
		}
		if err != nil {
			return count, err
		}
	}
}

func checkRecord(line []byte, head checkpoint) error {
	var rec record
	if err := json.Unmarshal(line, &rec); err != nil || rec.Index == nil {
		return errors.New("not an exported record")
	}
	leaf := make([]byte, 4, 4+len(rec.Header)+len(rec.Ciphertext))
	binary.BigEndian.PutUint32(leaf, uint32(len(rec.Header)))
	leaf = append(append(leaf, rec.Header...), rec.Ciphertext...)
	hash := tlog.RecordHash(leaf)
	if rec.LeafHash != nil && !bytes.Equal(rec.LeafHash, hash[:]) {
		return fmt.Errorf("record %d: its header and ciphertext do not hash to its leaf_hash: the record was altered", *rec.Index)
	}
	proof := make(tlog.RecordProof, len(rec.Hashes))
	for i, h := range rec.Hashes {
		if len(h) != tlog.HashSize {
			return fmt.Errorf("record %d: proof hash %d is not %d bytes", *rec.Index, i, tlog.HashSize)
		}
		copy(proof[i][:], h)
	}
	if err := tlog.CheckRecord(proof, head.size, head.root, *rec.Index, hash); err != nil {
		return fmt.Errorf("record %d is not included in the signed checkpoint: %v", *rec.Index, err)
	}
	return nil
}

// checkWitnesses verifies the cosignature of each witnesses/*.vkey found in the note and
// returns how many verified; an invalid one, or fewer than quorum, is an error.
func checkWitnesses(dir string, n *note.Note, quorum int) (int, error) {
	paths, _ := filepath.Glob(filepath.Join(dir, "witnesses", "*.vkey"))
	sort.Strings(paths)
	valid := 0
	for _, path := range paths {
		text, err := os.ReadFile(path)
		if err != nil {
			return valid, err
		}
		name, id, key, err := parseCosignerKey(strings.TrimSpace(string(text)))
		if err != nil {
			return valid, fmt.Errorf("%s: %v", filepath.Base(path), err)
		}
		when, found, err := cosignature(n, name, id, key)
		if err != nil {
			return valid, err
		}
		if !found {
			fmt.Printf("no cosignature by %s\n", name)
			continue
		}
		fmt.Printf("cosigned by %s at %s\n", name, time.Unix(int64(when), 0).UTC().Format(time.RFC3339))
		valid++
	}
	if valid < quorum {
		return valid, fmt.Errorf("%d valid witness cosignatures, %d required", valid, quorum)
	}
	return valid, nil
}

// parseCosignerKey reads <name>+<key ID hex>+base64(0x04 || Ed25519 public key), checking that
// the key ID is SHA-256(name || "\n" || 0x04 || key)[:4].
func parseCosignerKey(vkey string) (string, uint32, ed25519.PublicKey, error) {
	parts := strings.SplitN(vkey, "+", 3)
	if len(parts) != 3 {
		return "", 0, nil, errors.New("not a cosigner key (name+id+key)")
	}
	id, err1 := hex.DecodeString(parts[1])
	typed, err2 := base64.StdEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || len(id) != 4 || len(typed) != 1+ed25519.PublicKeySize || typed[0] != 0x04 {
		return "", 0, nil, errors.New("not an Ed25519 cosignature/v1 key")
	}
	digest := sha256.Sum256(append([]byte(parts[0]+"\n"), typed...))
	if !bytes.Equal(digest[:4], id) {
		return "", 0, nil, errors.New("the key ID does not match the key")
	}
	return parts[0], binary.BigEndian.Uint32(id), ed25519.PublicKey(typed[1:]), nil
}

// cosignature finds the witness's line among the note's other signatures: base64(key ID ||
// timestamp, 8 bytes big-endian || Ed25519 signature of "cosignature/v1\ntime <t>\n" || text).
func cosignature(n *note.Note, name string, id uint32, key ed25519.PublicKey) (uint64, bool, error) {
	for _, sig := range n.UnverifiedSigs {
		if sig.Name != name || sig.Hash != id {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(sig.Base64)
		if err != nil || len(raw) != 4+8+ed25519.SignatureSize {
			return 0, false, fmt.Errorf("the cosignature by %s is malformed", name)
		}
		when := binary.BigEndian.Uint64(raw[4:12])
		message := fmt.Sprintf("cosignature/v1\ntime %d\n%s", when, n.Text)
		if !ed25519.Verify(key, []byte(message), raw[12:]) {
			return 0, false, fmt.Errorf("the cosignature by %s does not verify over checkpoint.note", name)
		}
		return when, true, nil
	}
	return 0, false, nil
}
