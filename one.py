import http.client, json, subprocess, sys, time
c = http.client.HTTPConnection("127.0.0.1", 18442)
def one():
    c.request("POST", "/v1/chat/completions", json.dumps({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.7}), {"Content-Type":"application/json"})
    r = c.getresponse(); r.read()
for i in range(5): one()
p = subprocess.Popen("strace -f -tt -e trace=poll,recvfrom,sendto,sendmsg,read,write,writev -o /tmp/p31a/one.st " + " ".join("-p " + t for t in sys.argv[1:]), shell=True)
time.sleep(1)
one(); one()
time.sleep(0.3); p.send_signal(2); p.wait()
