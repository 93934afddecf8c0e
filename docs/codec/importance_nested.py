"""Importance on vs off on the nested ladder and the plain ECSQ rendition (docs/codec.md).

Run: PYTHONPATH=src python docs/codec/importance_nested.py  (output: docs/codec/importance_nested.txt)
"""
import torch, numpy as np
torch.set_num_threads(1)
from sakura.codec import codec_from_spec, ShardId, ShardKV
from sakura.capture import calibration_photos, token_sensitivity, template_importance, layer_sensitivity
from sakura.models import load_model, LayerKV, TemplateKV
from sakura.tasks import library_templates, heldout_photos
from sakura.tasks.quality import psnr_per_image
m=load_model('sakura-mini')
cal=calibration_photos(64,2); test=heldout_photos(64,n_per_source=2)[:6]
for task in ('look','texture','sticker'):
    tpl=library_templates(64,task=task,held_out=True)[0]
    kv=m.extract_template_kv(tpl.image[None], tpl.instruction).to(torch.float16)
    edit=lambda layers: m.edit(test, template_kv=TemplateKV(layers,kv.model_fingerprint,kv.template_fingerprint,kv.layout), steps=8).image
    ref=edit(list(kv.layers))
    tok=token_sensitivity(m,kv,cal,steps=8); att=template_importance(m,kv,cal,steps=8)
    for name, imps in (('none',[None]*6),('attention',[att[i] for i in range(6)]),('sensitivity',[tok[i] for i in range(6)])):
        for spec in ('layered:budgets=[1.0,2.0,3.0]','sakura:budget=1.0,quantiser="ecsq"'):
            c=codec_from_spec(spec)
            sh=[ShardKV(l.key,l.value,importance=imps[i],layer=i,num_layers=6) for i,l in enumerate(kv.layers)]
            tb=c.fit_tables(sh); ids=[ShardId('m','t',i) for i in range(6)]
            ds=[c.encode(s,i,tb) for s,i in zip(sh,ids)]
            ends=[c.level_ends(d) if c.supports_layers else [len(d)] for d in ds]
            out=[]
            for r in range(len(ends[0])):
                decs=[c.decode(d[:e[r]],i,tb) for d,e,i in zip(ds,ends,ids)]
                img=edit([LayerKV(d.key,d.value,d.keep_mask) for d in decs])
                out.append((sum(e[r] for e in ends), round(float(psnr_per_image(img,ref).mean()),1)))
            print(task, name, spec, out, flush=True)
