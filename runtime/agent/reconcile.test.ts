/** The node's reconciliation decisions (pure): destroy what the control plane ended, keep the rest. */
import { describe, expect, it } from 'vitest';
import { reconcileAction } from './reconcile.ts';

const live = { state: 'running', nodeId: 'n1', released: '0', placed: true };

describe('reconcileAction', () => {
  it('keeps a live sandbox the control plane places here with its reservation', () => {
    expect(reconcileAction(live, 'n1').action).toBe('keep');
    expect(reconcileAction({ ...live, state: 'paused' }, 'n1').action).toBe('keep');
  });
  it('destroys what the control plane ended, lost or placed elsewhere', () => {
    for (const state of ['killing', 'killed'])
      expect(reconcileAction({ ...live, state }, 'n1').action).toBe('destroy');
    expect(reconcileAction({ state: null, nodeId: null, released: null, placed: false }, 'n1').action).toBe(
      'destroy',
    );
    expect(reconcileAction({ ...live, nodeId: 'n2' }, 'n1').action).toBe('destroy');
  });
  it('leaves a create in flight to its operation', () => {
    expect(reconcileAction({ ...live, state: 'creating', placed: false, released: null }, 'n1').action).toBe(
      'keep',
    );
  });
  it('re-registers a live sandbox that holds no reservation', () => {
    expect(reconcileAction({ ...live, released: '1' }, 'n1').action).toBe('reregister');
    expect(reconcileAction({ ...live, placed: false }, 'n1').action).toBe('reregister');
  });
  it('brings a frozen or running sandbox to its record: thaw when it runs, freeze when it is paused frozen (F7)', () => {
    expect(reconcileAction(live, 'n1', true).action).toBe('thaw');
    expect(reconcileAction({ ...live, state: 'paused', pauseMode: 'frozen' }, 'n1', false).action).toBe(
      'freeze',
    );
    expect(reconcileAction({ ...live, state: 'paused', pauseMode: 'frozen' }, 'n1', true).action).toBe(
      'keep',
    );
    // a pause or resume in flight is its operation's
    for (const state of ['pausing', 'resuming']) {
      expect(reconcileAction({ ...live, state }, 'n1', true).action).toBe('keep');
      expect(reconcileAction({ ...live, state }, 'n1', false).action).toBe('keep');
    }
    // ending or placed elsewhere still wins
    expect(reconcileAction({ ...live, state: 'killing' }, 'n1', true).action).toBe('destroy');
    expect(reconcileAction({ ...live, nodeId: 'n2' }, 'n1', true).action).toBe('destroy');
    // so does a re-registration; a record placed on no node is not thawed
    expect(reconcileAction({ ...live, released: '1' }, 'n1', true).action).toBe('reregister');
    expect(reconcileAction({ ...live, nodeId: null }, 'n1', true).action).toBe('keep');
  });
});
