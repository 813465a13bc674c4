package lbpod

import (
	"fmt"
	"testing"
)

// What the iptables back end left is removed whole: the jumps from built-in chains first, then
// every LBSVC chain flushed, then deleted; rules of others stay; nothing of ours, no payload.
func TestPlanRemoveIPTables(t *testing.T) {
	saved, err := ParseSave(`*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:LBSVC-PREROUTING - [0:0]
:LBSVC-SERVICES - [0:0]
:LBSVC-POSTROUTING - [0:0]
-A PREROUTING -j LBSVC-PREROUTING
-A PREROUTING -p tcp -j ACCEPT
-A POSTROUTING -j LBSVC-POSTROUTING
-A LBSVC-PREROUTING -d 172.18.0.18/32 -j LBSVC-SERVICES
-A LBSVC-SERVICES -d 172.18.0.18/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.109.201.193:80
-A LBSVC-POSTROUTING -d 10.109.201.193/32 -j MASQUERADE
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:LBSVC-INPUT - [0:0]
-A INPUT -j LBSVC-INPUT
-A FORWARD -g LBSVC-INPUT
-A LBSVC-INPUT -i net1 -j DROP
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
-A PREROUTING -j MARK --set-mark 1
COMMIT
`)
	if err != nil {
		t.Fatal(err)
	}
	payload, changes := PlanRemoveIPTables(saved, "iptables-nft")
	want := "*filter\n-D FORWARD -g LBSVC-INPUT\n-D INPUT -j LBSVC-INPUT\n-F LBSVC-INPUT\n-X LBSVC-INPUT\nCOMMIT\n" +
		"*nat\n-D POSTROUTING -j LBSVC-POSTROUTING\n-D PREROUTING -j LBSVC-PREROUTING\n" +
		"-F LBSVC-POSTROUTING\n-F LBSVC-PREROUTING\n-F LBSVC-SERVICES\n-X LBSVC-POSTROUTING\n-X LBSVC-PREROUTING\n-X LBSVC-SERVICES\nCOMMIT\n"
	if payload != want {
		t.Errorf("payload:\n%s\nwant:\n%s", payload, want)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	wantChanges := fmt.Sprint([]string{
		"-jump iptables-nft -t filter -A FORWARD -g LBSVC-INPUT", "-jump iptables-nft -t filter -A INPUT -j LBSVC-INPUT",
		"-chain iptables-nft -t filter -X LBSVC-INPUT",
		"-jump iptables-nft -t nat -A POSTROUTING -j LBSVC-POSTROUTING", "-jump iptables-nft -t nat -A PREROUTING -j LBSVC-PREROUTING",
		"-chain iptables-nft -t nat -X LBSVC-POSTROUTING", "-chain iptables-nft -t nat -X LBSVC-PREROUTING", "-chain iptables-nft -t nat -X LBSVC-SERVICES",
	})
	if fmt.Sprint(got) != wantChanges {
		t.Errorf("changes:\n%v\nwant:\n%v", got, wantChanges)
	}
	if payload, changes := PlanRemoveIPTables(Saved{"nat": {"PREROUTING": {"-p tcp -j ACCEPT"}}, "filter": {}}, "iptables"); payload != "" || changes != nil {
		t.Errorf("nothing of ours: payload %q, changes %v", payload, changes)
	}
}
