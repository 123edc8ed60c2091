// The HTML report's script (arbiter/report/html.py inlines it into each page, after the
// report's JSON and the layout library dagre): the graph view, search, sorting, and the
// page's measurements of itself that tests read (data-* attributes of <html>).
(function(){
var data=JSON.parse(document.getElementById('report-data').textContent);
var COLORS=JSON.parse(document.getElementById('report-colors').textContent);
var NS='http://www.w3.org/2000/svg',TOP='(top level)';
function el(tag,attrs,parent){var e=document.createElementNS(NS,tag);for(var k in attrs)e.setAttribute(k,attrs[k]);if(parent)parent.appendChild(e);return e;}
function color(b){return COLORS[b]||'#9d9d9d';}
function runsOn(p){return p.compiled?p.backend:p.planned_backend;}
function plural(n,w){return n+' '+w+(n==1?'':'s');}
var box=document.getElementById('details');box.onclick=function(){box.style.display='none';};

function shortOp(op){return op.replace(/^aten\./,'').replace(/\.default$/,'');}
function opsOf(nodes){  // `relu, max_pool2d_with_indices +1 op`: the first two ops met
  var ops=[];nodes.forEach(function(n){var o=shortOp(n.op);if(ops.indexOf(o)<0)ops.push(o);});
  return ops.slice(0,2).join(', ')+(ops.length>2?' +'+plural(ops.length-2,'op'):'');}
function topUnits(nodes){
  // The boxes of the nodes outside any module: per partition, one box per run of them
  // that no node in a module interrupts, in graph order (n._unit: `p:ID`, then `p:ID.1`,
  // `p:ID.2`...), so a model's functional ops between its modules stay where they are in
  // the flow (one box per partition drew a sequential CNN as a star around it); a graph
  // without modules keeps one box per partition.
  var run={},count={};
  nodes.forEach(function(n){
    if(n._path.length){run={};return;}
    var p=n.partition;
    if(!(p in run)){var k=count[p]||0;count[p]=k+1;run[p]='p:'+p+(k?'.'+k:'');}
    n._unit=run[p];});}

function View(svg){
  var rep=data[+svg.dataset.report],g=null;
  rep.graphs.forEach(function(x){if(x.graph_id==+svg.dataset.graph)g=x;});
  var parts={};g.partitions.forEach(function(p){parts[p.id]=p;});
  var depth=+(svg.closest('.graph-block').querySelector('table.modules th').textContent.match(/depth (\d+)/)||[0,1])[1];
  var open={},st={x:0,y:0,k:1},root=el('g',{},svg),self=this;
  g.graph.forEach(function(n){n._path=n.module?n.module.split('.'):[];});
  topUnits(g.graph);
  function chain(n){  // the open groups around a node, outermost first (dagre clusters)
    var p=n._path,out=[];
    if(!p.length)return open[n._unit]?['c:'+n._unit]:[];
    for(var k=Math.min(depth,p.length);k<=p.length;k++){var m='m:'+p.slice(0,k).join('.');if(!open[m])break;out.push('c:'+m);}
    return out;}
  function unitOf(n,c){  // the box a node is drawn in: a module group, a partition group or itself
    var p=n._path;
    if(!p.length)return c.length?'n:'+n.name:n._unit;
    var k=Math.min(depth,p.length)+c.length;
    return k>p.length?'n:'+n.name:'m:'+p.slice(0,k).join('.');}
  function partLabel(n){return '#'+n.partition+' '+runsOn(parts[n.partition]);}
  this.layout=function(){
    var G=new dagre.graphlib.Graph({compound:true,multigraph:false});
    G.setGraph({rankdir:'TB',nodesep:14,ranksep:26,marginx:10,marginy:10});G.setDefaultEdgeLabel(function(){return{};});
    var units={},of={},q=(document.getElementById('search').value||'').trim().toLowerCase();
    g.graph.forEach(function(n){var c=chain(n),u=unitOf(n,c);of[n.name]=u;var x=units[u]||(units[u]={key:u,nodes:[],by:{},fell:false,hit:0});
      x.nodes.push(n);var b=runsOn(parts[n.partition]);x.by[b]=(x.by[b]||0)+1;if(parts[n.partition].fallbacks.length)x.fell=true;
      if(q&&n.op.toLowerCase().indexOf(q)>=0)x.hit++;
      c.forEach(function(ck,i){if(!G.hasNode(ck)){G.setNode(ck,{label:ck.charAt(2)=='p'?partLabel(n):ck.slice(4),cluster:true});if(i)G.setParent(ck,c[i-1]);}});
      if(c.length)x.parent=c[c.length-1];});
    Object.keys(units).forEach(function(k){var u=units[k],n=u.nodes[0];
      var all=parts[n.partition].nodes,some=k.charAt(0)=='p'&&u.nodes.length<all;
      // a run of a partition's nodes outside modules: named by its ops, and how many of
      // the partition's nodes it holds; a partition's whole: by the partition
      u.label=k.charAt(0)=='n'?shortOp(n.op):some?opsOf(u.nodes):k.charAt(0)=='p'?partLabel(n):k.slice(2).split('.').slice(-2).join('.');
      u.sub=k.charAt(0)=='n'?'':some?u.nodes.length+' of #'+n.partition+"'s "+plural(all,'node'):plural(u.nodes.length,'node');
      G.setNode(k,{width:Math.max(90,Math.min(300,14+7.4*Math.max(u.label.length,u.sub.length+10))),height:u.sub?38:24});if(u.parent)G.setParent(k,u.parent);});
    var seen={};g.graph.forEach(function(n){n.inputs.forEach(function(i){var a=of[i],b=of[n.name];if(!a||a==b||seen[a+'>'+b])return;seen[a+'>'+b]=1;G.setEdge(a,b);});});
    dagre.layout(G);
    while(root.firstChild)root.removeChild(root.firstChild);
    G.nodes().forEach(function(k){var v=G.node(k);if(!v||!v.cluster)return;
      var c=el('g',{'class':'cluster','data-cluster':k.slice(2)},root);el('rect',{x:v.x-v.width/2,y:v.y-v.height/2,width:v.width,height:v.height,rx:6},c);
      var t=el('text',{x:v.x-v.width/2+6,y:v.y-v.height/2+12},c);t.textContent='▾ '+v.label+' (close)';t.onclick=function(ev){ev.stopPropagation();delete open[k.slice(2)];self.layout();};});
    G.edges().forEach(function(e){var pts=G.edge(e).points,d='M'+pts.map(function(p){return p.x.toFixed(1)+','+p.y.toFixed(1);}).join('L');el('path',{'class':'edge','data-edge':e.v+' '+e.w,d:d},root);});
    var hits=0;
    Object.keys(units).forEach(function(k){var u=units[k],v=G.node(k),x=v.x-v.width/2,y=v.y-v.height/2;hits+=u.hit;
      var isNode=k.charAt(0)=='n',grp=el('g',{'class':'unit'+(isNode?' node':'')+(u.hit?' hit':'')+(u.fell?' fell':''),'data-unit':k},root);
      var main=Object.keys(u.by).sort(function(a,b){return u.by[b]-u.by[a];})[0];
      el('rect',{'class':'box',x:x,y:y,width:v.width,height:v.height,rx:4,style:isNode?'fill:'+color(main):'stroke:'+color(main)},grp);
      if(!isNode){var off=0;Object.keys(u.by).forEach(function(b){var w=(v.width-4)*u.by[b]/u.nodes.length;el('rect',{x:x+2+off,y:y+v.height-8,width:w,height:6,style:'fill:'+color(b)},grp);off+=w;});}
      var t=el('text',{x:x+6,y:y+15},grp);t.textContent=u.label;if(u.sub){var s=el('text',{x:x+6,y:y+28},grp);s.textContent=u.sub+(u.fell?' · fell back':'');}
      var tip=el('title',{},grp);tip.textContent=(k.charAt(0)=='m'?k.slice(2):u.label)+': '+Object.keys(u.by).map(function(b){return b+' '+u.by[b];}).join(', ');
      grp.onclick=function(ev){ev.stopPropagation();if(isNode){show(u.nodes[0]);return;}open[k]=1;self.layout();};});
    self.bounds={w:G.graph().width||1,h:G.graph().height||1};self.hits=hits;apply();
    var counter=document.getElementById('hits');if(counter){var tot=0;views.forEach(function(w){tot+=w.hits||0;});counter.textContent=q?plural(tot,'node'):'';counter.dataset.hits=q?tot:'';}
  };
  function show(n){var p=parts[n.partition],o=(g.ops.filter(function(x){return x.op==n.op;})[0])||{};
    var t=n.name+'\nop '+n.op+'\nmodule '+(n.module||TOP)+'\nout '+n.dtype+'['+n.shape.join('x')+']\ninputs '+n.inputs.join(', ')+
      '\npartition #'+p.id+(p.compiled?' on '+p.backend+' (planned '+p.planned_backend+')':' planned for '+p.planned_backend+' (not compiled)')+'\nable: '+(o.able||[]).join(', ');
    for(var b in (o.refused||{}))t+='\nrefused by '+b+': '+o.refused[b];
    p.fallbacks.forEach(function(f){t+='\nfallback at '+f.stage+': '+f.from_backend+' -> '+f.to_backend+': '+f.reason;});
    box.textContent=t;box.style.display='block';}
  function apply(){root.setAttribute('transform','translate('+st.x+','+st.y+') scale('+st.k+')');}
  this.fit=function(){var r=svg.getBoundingClientRect(),W=r.width||800,H=r.height||400;
    st.k=Math.max(0.35,Math.min(1.2,W/self.bounds.w,Math.max(H/self.bounds.h,0.6*W/self.bounds.w)));
    st.x=Math.max(0,(W-self.bounds.w*st.k)/2);st.y=Math.max(0,(H-self.bounds.h*st.k)/2);apply();};
  this.zoom=function(f,cx,cy){var r=svg.getBoundingClientRect();cx=cx===undefined?r.width/2:cx;cy=cy===undefined?r.height/2:cy;
    var k=Math.max(0.05,Math.min(6,st.k*f));st.x=cx-(cx-st.x)*k/st.k;st.y=cy-(cy-st.y)*k/st.k;st.k=k;apply();};
  this.openAll=function(){g.graph.forEach(function(n){for(var k=depth;k<=n._path.length;k++)open['m:'+n._path.slice(0,k).join('.')]=1;if(n._unit)open[n._unit]=1;});self.layout();self.fit();};
  this.closeAll=function(){open={};self.layout();self.fit();};
  svg.addEventListener('wheel',function(ev){ev.preventDefault();var r=svg.getBoundingClientRect();self.zoom(ev.deltaY<0?1.15:1/1.15,ev.clientX-r.left,ev.clientY-r.top);},{passive:false});
  var drag=null;svg.addEventListener('pointerdown',function(ev){drag={x:ev.clientX-st.x,y:ev.clientY-st.y};});
  window.addEventListener('pointermove',function(ev){if(!drag)return;st.x=ev.clientX-drag.x;st.y=ev.clientY-drag.y;apply();});
  window.addEventListener('pointerup',function(){drag=null;});
}
var views=[];
document.querySelectorAll('svg.graph').forEach(function(svg){var v=new View(svg);views.push(v);svg._view=v;v.layout();v.fit();
  var tools=svg.closest('details').querySelector('.tools');
  tools.addEventListener('click',function(ev){var a=ev.target.dataset.act;if(a=='fit')v.fit();if(a=='in')v.zoom(1.25);if(a=='out')v.zoom(0.8);if(a=='open')v.openAll();if(a=='close')v.closeAll();});});
document.querySelectorAll('details.graphview').forEach(function(d){d.addEventListener('toggle',function(){if(d.open){var v=d.querySelector('svg.graph')._view;v.fit();}});});
var q=document.getElementById('search');
q.addEventListener('input',function(){views.forEach(function(v){v.layout();});});
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
  var tb=th.closest('table').tBodies[0],rows=Array.prototype.slice.call(tb.rows),col=th.cellIndex,asc=th.dataset.asc!='1';
  th.dataset.asc=asc?'1':'0';rows.sort(function(a,b){var x=a.cells[col].dataset.v,y=b.cells[col].dataset.v,nx=parseFloat(x),ny=parseFloat(y);
    var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));return asc?c:-c;});
  rows.forEach(function(r){tb.appendChild(r);});});});
var h=location.hash.match(/search=([^&]*)/);  // a link (or a test) can open a search
if(h){q.value=decodeURIComponent(h[1]);q.dispatchEvent(new Event('input'));}
if(/[#&]open\b/.test(location.hash))views.forEach(function(v){v.openAll();});  // every box opened
if(/[#&]tables\b/.test(location.hash))document.querySelectorAll('details').forEach(function(x){x.open=true;});  // every section
var ctx=document.createElement('canvas').getContext('2d');
function narrow(sel){  // words wider than their cell: headers or cells wrapped mid-word
  var out=[];document.querySelectorAll(sel).forEach(function(c){if(!c.offsetParent||c.closest('table.modules'))return;
    var cs=getComputedStyle(c),inner=c.clientWidth-parseFloat(cs.paddingLeft)-parseFloat(cs.paddingRight);ctx.font=cs.font;
    c.textContent.split(/\s+/).forEach(function(w){if(w&&ctx.measureText(w).width>inner+0.5)out.push(w);});});
  return out.join(' ');}
function measure(){var d=document.documentElement,ov=document.querySelector('.overview');
  d.setAttribute('data-overflow',Math.max(0,d.scrollWidth-window.innerWidth));
  if(ov){var r=ov.getBoundingClientRect();d.setAttribute('data-overview-bottom',Math.round(r.bottom));d.setAttribute('data-overview-right',Math.round(r.right));}
  var lefts={};document.querySelectorAll('section.report').forEach(function(x){lefts[Math.round(x.getBoundingClientRect().left)]=1;});
  d.setAttribute('data-columns',Object.keys(lefts).length);
  d.setAttribute('data-window',window.innerWidth+'x'+window.innerHeight);
  d.setAttribute('data-narrow-headers',narrow('th'));d.setAttribute('data-narrow-cells',narrow('td:not(.long)'));
  var tall=0;document.querySelectorAll('tbody tr').forEach(function(r){if(r.offsetParent)tall=Math.max(tall,r.getBoundingClientRect().height);});
  d.setAttribute('data-tallest-row',Math.round(tall));  // px, of the table rows on show
  var wide=[];document.querySelectorAll('.tablewrap').forEach(function(w){if(w.offsetParent&&w.scrollWidth>w.clientWidth+1)wide.push(w.firstChild.classList[1]);});
  d.setAttribute('data-wide-tables',wide.join(' '));}  // the tables scrolling inside their box
measure();window.addEventListener('resize',measure);
document.documentElement.setAttribute('data-ready','1');
})();
