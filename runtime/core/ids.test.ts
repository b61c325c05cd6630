import { describe, expect, it } from 'vitest';
import { DNS_SAFE_ID_PATTERN, ID_PATTERN, newId, newSandboxId } from './ids.ts';

describe('ids', () => {
  it('new sandbox ids are DNS labels E2B clients can put in <port>-<id>.<domain>', () => {
    for (let i = 0; i < 200; i++) {
      const id = newSandboxId();
      expect(id).toMatch(/^sbx[a-z0-9]{20}$/);
      expect(id).toMatch(new RegExp(DNS_SAFE_ID_PATTERN));
      expect(id).toMatch(new RegExp(ID_PATTERN));
      // a host `49983-<id>.example.test` splits back into port and id on the first `-`
      expect(`49983-${id}.example.test`.split('.')[0]?.split('-')).toEqual(['49983', id]);
    }
  });

  it('the id pattern still accepts ids made by newId and before DNS-safe sandbox ids', () => {
    expect(newId('op')).toMatch(new RegExp(ID_PATTERN));
    expect('sbx_k3m4n5p6q7r8s9t2u3v4').toMatch(new RegExp(ID_PATTERN));
    for (const bad of ['SBX1234567890', 'sbx-1234567890', 'sbx_12', '../../etc', 'sbx_abc.def12345']) {
      expect(bad).not.toMatch(new RegExp(ID_PATTERN));
    }
  });
});
