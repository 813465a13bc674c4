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
// to the other, so mixing them would split the ruleset in two. A back end that cannot even list
// its rules (its kernel module is not loaded and a pod cannot load it) is not the one in use.
func ChooseFlavour(nft, legacy RuleCount) Flavour {
	switch {
	case !nft.OK && legacy.OK:
		return FlavourLegacy
	case nft.OK && !legacy.OK:
		return FlavourNFT
	case legacy.Rules > nft.Rules:
		return FlavourLegacy
	default:
		return FlavourNFT
	}
}

// RuleCount is what one back end's *-save printed: whether it worked, and how many rules.
type RuleCount struct {
	OK    bool
	Rules int
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
	nft := countRules(ctx, "iptables-nft-save", "ip6tables-nft-save")
	legacy := countRules(ctx, "iptables-legacy-save", "ip6tables-legacy-save")
	f := ChooseFlavour(nft, legacy)
	return PathsFor(f), fmt.Sprintf("nft: %+v, legacy: %+v: using %s", nft, legacy, f)
}

// countRules counts the rules (lines starting with "-") the *-save binaries print; it is OK when
// at least one of them ran.
func countRules(ctx context.Context, saves ...string) RuleCount {
	var c RuleCount
	for _, save := range saves {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := exec.CommandContext(cctx, save).Output()
		cancel()
		if err != nil {
			continue
		}
		c.OK = true
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "-") {
				c.Rules++
			}
		}
	}
	return c
}
