package lbpod

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// IPTablesPaths names the iptables and ip6tables binaries to drive.
type IPTablesPaths struct {
	IPv4 string
	IPv6 string
}

// Flavour is an iptables back end: "nft" or "legacy".
type Flavour string

// The two back ends an image may ship.
const (
	FlavourNFT    Flavour = "nft"
	FlavourLegacy Flavour = "legacy"
)

// ChooseFlavour picks the back end the host uses: the one whose rules are more numerous, nft
// when they tie (an empty namespace, a fresh host). Rules written by one back end are invisible
// to the other, so mixing them would split the ruleset in two.
func ChooseFlavour(nftRules, legacyRules int) Flavour {
	if legacyRules > nftRules {
		return FlavourLegacy
	}
	return FlavourNFT
}

// PathsFor returns the binaries of a flavour.
func PathsFor(f Flavour) IPTablesPaths {
	return IPTablesPaths{IPv4: "iptables-" + string(f), IPv6: "ip6tables-" + string(f)}
}

// DetectIPTables decides which binaries to use: when both flavours are installed, the one that
// holds more rules; when only plain iptables/ip6tables exist, those. It returns the paths and
// a sentence saying why, for the log.
func DetectIPTables(ctx context.Context) (IPTablesPaths, string) {
	_, errNFT := exec.LookPath("iptables-nft-save")
	_, errLegacy := exec.LookPath("iptables-legacy-save")
	switch {
	case errNFT != nil && errLegacy != nil:
		return IPTablesPaths{IPv4: "iptables", IPv6: "ip6tables"}, "only iptables/ip6tables installed"
	case errLegacy != nil:
		return PathsFor(FlavourNFT), "only iptables-nft installed"
	case errNFT != nil:
		return PathsFor(FlavourLegacy), "only iptables-legacy installed"
	}
	nft := countRules(ctx, "iptables-nft-save") + countRules(ctx, "ip6tables-nft-save")
	legacy := countRules(ctx, "iptables-legacy-save") + countRules(ctx, "ip6tables-legacy-save")
	f := ChooseFlavour(nft, legacy)
	return PathsFor(f), fmt.Sprintf("nft shows %d rules, legacy %d: using %s", nft, legacy, f)
}

// countRules counts the rules (lines starting with "-") a *-save binary prints; a failure counts
// as none, since a back end that cannot even list is not the one in use.
func countRules(ctx context.Context, save string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, save).Output()
	if err != nil {
		return 0
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "-") {
			n++
		}
	}
	return n
}
