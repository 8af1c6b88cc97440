"""The live status page: one static HTML document that polls /status.json once a second.

With a metrics token the page itself is behind HTTP Basic (token as password): the browser asks once
and sends the same credentials with each poll (same origin)."""

STATUS_HTML = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gt_serve status</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.3rem;margin:0 0 .2rem} h2{font-size:1.05rem;margin:1.2rem 0 .4rem}
table{border-collapse:collapse;background:#fff;min-width:28rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f0f0f0} .busy{color:#b45309;font-weight:600} .idle{color:#15803d}
#err{color:#b91c1c} small{color:#666}
</style></head><body>
<h1>gt_serve <span id="node"></span></h1><small id="updated">loading&hellip;</small> <span id="err"></span>
<h2>Lanes</h2><table id="lanes"><thead><tr><th>lane</th><th>device</th><th>state</th><th>batches</th><th>launched</th><th>busy&nbsp;s</th></tr></thead><tbody></tbody></table>
<h2>Models</h2><table id="models"><thead><tr><th>model</th><th>version</th><th>state</th><th>queue</th><th>requests&nbsp;ok</th><th>failed</th><th>inferences</th><th>executions</th><th>provider</th></tr></thead><tbody></tbody></table>
<h2>Energy</h2><table id="energy"><thead><tr><th>model</th><th>device</th><th>J / inference</th><th>joules</th></tr></thead><tbody></tbody></table>
<h2>Peers</h2><table id="peers"><thead><tr><th>node</th><th>state</th><th>age&nbsp;s</th></tr></thead><tbody></tbody></table>
<script>
function cell(t){const td=document.createElement('td');td.textContent=t;return td}
function fill(id,rows){const tb=document.querySelector('#'+id+' tbody');tb.replaceChildren();
 for(const r of rows){const tr=document.createElement('tr');for(const c of r){const td=cell(c.t===undefined?c:c.t);if(c.cls)td.className=c.cls;tr.appendChild(td)}tb.appendChild(tr)}}
async function tick(){try{const r=await fetch(location.origin+location.pathname.replace(/[^/]*$/,'')+'status.json',{cache:'no-store'});
 if(!r.ok)throw new Error(r.status===401?'the metrics port needs the token (HTTP 401)':'HTTP '+r.status);
 const s=await r.json();
 document.getElementById('node').textContent='\\u2014 '+s.node+' ('+s.server+')';
 fill('lanes',s.lanes.map(l=>[l.id,l.device,{t:l.busy?'busy':'idle',cls:l.busy?'busy':'idle'},l.batches,l.launched,l.busy_s]));
 fill('models',s.models.map(m=>[m.name,m.version,m.state,m.queue,m.success,m.fail,m.inferences,m.executions,(m.providers||[]).join(',')]));
 fill('energy',(s.energy||[]).map(e=>[e.model,e.device,e.joules_per_inference.toFixed(4),e.joules.toFixed(2)]));
 fill('peers',(s.peers||[]).map(p=>[p.node,p.state,p.age_s.toFixed(1)]));
 document.getElementById('updated').textContent='updated '+new Date(s.time_s*1000).toLocaleTimeString();
 document.getElementById('err').textContent='';document.body.dataset.ready='1';
}catch(e){document.getElementById('err').textContent='status unavailable: '+e}}
tick();setInterval(tick,1000);
</script></body></html>
"""
