// tlogfollow follows a thinkgate log the way an independent monitor would, with Go's
// golang.org/x/mod/sumdb/note and sumdb/tlog only: it verifies the checkpoint against the
// log's verifier key, reads hash tiles over HTTP (tlog.TileHashReader checks every tile it
// reads against the signed tree hash), recomputes the tree hash, and proves each record given
// on stdin ("<index> <base64 leaf hash>" lines) and, if given, the consistency with an older
// checkpoint ("old <size> <base64 root>").
//
// Usage: tlogfollow <base URL of /tlog> <verifier key file> < expectations
package main

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type tiles struct{ base string }

func (t tiles) Height() int { return 8 }

func (t tiles) ReadTiles(want []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(want))
	for i, tile := range want {
		// Go names tiles tile/<H>/<L>/<N>; C2SP tlog-tiles drops the height.
		path := strings.Replace(tile.Path(), "tile/8/", "tile/", 1)
		data, err := get(t.base + "/" + path)
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

func (t tiles) SaveTiles([]tlog.Tile, [][]byte) {}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

func hash(text string) tlog.Hash {
	raw, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(raw) != tlog.HashSize {
		fail("not a base64 hash: %q", text)
	}
	var h tlog.Hash
	copy(h[:], raw)
	return h
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	base := os.Args[1]
	vkey, err := os.ReadFile(os.Args[2])
	if err != nil {
		fail("%v", err)
	}
	verifier, err := note.NewVerifier(strings.TrimSpace(string(vkey)))
	if err != nil {
		fail("verifier key: %v", err)
	}
	signed, err := get(base + "/checkpoint")
	if err != nil {
		fail("%v", err)
	}
	opened, err := note.Open(signed, note.VerifierList(verifier))
	if err != nil {
		fail("checkpoint: %v", err)
	}
	lines := strings.Split(opened.Text, "\n")
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	tree := tlog.Tree{N: size, Hash: hash(lines[2])}
	reader := tlog.TileHashReader(tree, tiles{base})
	root, err := tlog.TreeHash(size, reader)
	if err != nil || root != tree.Hash {
		fail("tree hash from tiles: %v (%v vs %v)", err, root, tree.Hash)
	}
	proved, scanner := 0, bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 3 && fields[0] == "old" {
			old, _ := strconv.ParseInt(fields[1], 10, 64)
			proof, err := tlog.ProveTree(size, old, reader)
			if err != nil {
				fail("prove tree %d -> %d: %v", old, size, err)
			}
			if err := tlog.CheckTree(proof, size, tree.Hash, old, hash(fields[2])); err != nil {
				fail("consistency %d -> %d: %v", old, size, err)
			}
			continue
		}
		index, _ := strconv.ParseInt(fields[0], 10, 64)
		proof, err := tlog.ProveRecord(size, index, reader)
		if err != nil {
			fail("prove record %d: %v", index, err)
		}
		if err := tlog.CheckRecord(proof, size, tree.Hash, index, hash(fields[1])); err != nil {
			fail("record %d: %v", index, err)
		}
		proved++
	}
	fmt.Printf("OK size=%d proved=%d\n", size, proved)
}
